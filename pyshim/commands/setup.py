"""`pyshim setup` (being written)."""


def add_arguments(parser):
    pass


def run(args):
    raise SystemExit("pyshim setup: not written yet")
