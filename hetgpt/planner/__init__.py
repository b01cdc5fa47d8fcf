"""
The planner: the dry run. How a GPT config trains on given devices, decided
before any weight is allocated. It imports nothing of run/ or data/.
"""
