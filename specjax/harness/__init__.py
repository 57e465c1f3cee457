"""The harness behind `python -m specjax.run`: the config's checks (run_config), the run
pipeline (run_lib), its reports (report) and the one-prompt verdict (verdict)."""
