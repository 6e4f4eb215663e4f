from ggufbridge.cli import main

main()
