"""gpuq: a Redis-backed distributed task queue that schedules AI inference work onto GPUs."""

from gpuq.app import App, Context
from gpuq.client import Queue, Task
from gpuq.config import Config
from gpuq.errors import GpuqError, TaskError
from gpuq.task import Priority, State, TaskRecord

__all__ = ["App", "Config", "Context", "GpuqError", "Priority", "Queue", "State", "Task", "TaskError",
           "TaskRecord"]
__version__ = "0.1.0"
