# nbgrader (and the formgrader in JupyterLab) read this file from the directory they start in.
# The course's configuration lives in grader/nbgrader_config.py.
c = get_config()  # noqa: F821
load_subconfig("grader/nbgrader_config.py")  # noqa: F821
