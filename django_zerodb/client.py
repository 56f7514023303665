"""``manage.py dbshell``: there is no SQL shell for an encrypted store."""

from __future__ import annotations

from django.db.backends.base.client import BaseDatabaseClient

from django_zerodb.exceptions import NotSupportedError


class DatabaseClient(BaseDatabaseClient):
    executable_name = "zerodb"

    @classmethod
    def settings_to_cmd_args_env(cls, settings_dict, parameters):
        raise NotSupportedError(
            "the encrypted database has no SQL shell: use `manage.py shell` and the ORM, "
            "or `manage.py zerodb_status`"
        )
