"""The training recipes (`NAME.yaml`) and evaluation suites (`suites/NAME.yaml`). This folder
installs as `selfplay.configs`, so that an installed selfplay finds them by name:
`selfplay train quickstart`, `selfplay eval --suite held_out`."""
