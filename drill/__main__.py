from drill.cli.app import main

main()
