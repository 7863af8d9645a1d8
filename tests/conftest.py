pytest_plugins = ["tests.no_skips"]
