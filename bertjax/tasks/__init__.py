"""Fine-tuning task families, one file each (see base.py); found through its registry."""
