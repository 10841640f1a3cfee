"""Starting a run: the command line, the preflight checks, the doctor, the roles' startup."""
