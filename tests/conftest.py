"""The suite's one pytest hook: the longest tests (a minute or more each, none with a module-wide
fixture) start first. On two workers (make test) a long test that starts last runs alone at the
end while the other worker sits idle."""
LONGEST = ('test_gpu_check.py::test_gpu_check_dry_run',
           'test_membership.py::test_a_machine_leaves_then_another_joins')


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: not any(name in item.nodeid for name in LONGEST))  # (stable)
