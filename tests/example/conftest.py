"""The example project's tests run in a pytest process of their own.

Django is configured once per process, and the main run uses the backend's test settings
(``tests.django.settings``, from pyproject.toml), which do not install the ``hr`` app. So:

* in the main run, this directory contributes ``test_example_project.py``, whose
  ``test_site_suite`` starts ``python -m pytest tests/example/site_tests
  --ds=tests.example.settings`` and expects it to pass (the other tests there run
  ``manage.py`` and ``demo.py`` as subprocesses in a temporary copy of the project);
* in that inner run (settings ``tests.example.settings``), only ``site_tests/`` is
  collected: the views, the admin and ``seed_hr`` with Django's test client.

To run the inner suite directly:
``.venv/bin/python -m pytest tests/example/site_tests --ds=tests.example.settings``.
"""

import os

SETTINGS = "tests.example.settings"
INNER = os.environ.get("DJANGO_SETTINGS_MODULE") == SETTINGS

collect_ignore = ["test_example_project.py"] if INNER else ["site_tests"]
