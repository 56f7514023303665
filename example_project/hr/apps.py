from django.apps import AppConfig


class HrConfig(AppConfig):
    name = "hr"
    verbose_name = "Human resources (encrypted)"
    default_auto_field = "django.db.models.BigAutoField"
