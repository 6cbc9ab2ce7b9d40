from tailwatch.cli import main

main()
