"""
A research edit of the optimizer, written as one: model.py's make_optimizer rewritten to SGD with
heavy-ball momentum for every parameter (one optimizer, one group, no weight decay). EDIT is an
(old, new) replacement of model.py's text, old the function as model.py has it now (whatever
optimizer it builds); nothing else of the repository is edited (tests/test_optimizer_edit.py).
"""
import os

from trainer import ROOT

NEW = """def make_optimizer(model, config):
    # the edit: SGD with momentum for every parameter
    return [torch.optim.SGD(model.parameters(), lr=config['learning_rate'],
                            momentum=0.9)]
"""


def current():
    # model.py's make_optimizer, from its def to the two blank lines after it
    text = open(os.path.join(ROOT, 'model.py'), encoding='utf-8').read()
    start = text.index('def make_optimizer(')
    return text[start:text.index('\n\n\n', start) + 1]


EDIT = (current(), NEW)
