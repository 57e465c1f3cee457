"""When speculation pays: cost_model.py (the cost model and the measured Costs) and
adaptive.py (the in-loop controller). Pure: no timing (specjax/bench/ measures), and no
decode imports; imports only core."""
