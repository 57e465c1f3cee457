"""Draft distillation (DistillSpec): divergences.py (losses, named in the registry), prompts.py
and data.py (offline training data labelled by the target), trainer.py (the optax loop with
orbax checkpoints). Imports core, models, checkpoints, drafters and decode (the target
labels its data with the Engine); the entry point is specjax/train_draft.py."""
