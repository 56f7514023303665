from django.apps import AppConfig


class BenchAppConfig(AppConfig):
    name = "bench.djangoapp"
    label = "benchapp"
    default_auto_field = "django.db.models.BigAutoField"
