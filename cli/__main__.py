from cli.app import main

if __name__ == "__main__":  # not again where a spawned worker imports this module
    main()
