"""`pyshim serve` (being written)."""


def add_arguments(parser):
    pass


def run(args):
    raise SystemExit("pyshim serve: not written yet")
