"""When speculation pays: the cost model, cost measurement, and the adaptive controller."""
