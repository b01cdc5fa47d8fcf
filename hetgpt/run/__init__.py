"""
The run: the ranks while they train, and what a run leaves in out_dir.
"""
