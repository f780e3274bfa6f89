from harnessrl.cli import main

main()
