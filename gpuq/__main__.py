from gpuq.cli import main

main()
