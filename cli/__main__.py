from cli.app import main

main()
