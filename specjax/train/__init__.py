"""Draft distillation (DistillSpec): divergences, data, and the training loop."""
