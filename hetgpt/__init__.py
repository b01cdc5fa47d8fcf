"""
hetgpt's machinery, under the files a researcher runs and edits at the
root. It is organised by who runs the code: planner/ (the dry run), run/
(the ranks while they train), data/ (tokens in), and the shared leaves
beside them. README.md's table is the index of the modules.
"""
