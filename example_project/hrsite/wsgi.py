"""WSGI entry point of the example HR site (``hrsite.wsgi.application``)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hrsite.settings")

application = get_wsgi_application()
