"""``qm``: the command line for researchers, managers and operators."""
