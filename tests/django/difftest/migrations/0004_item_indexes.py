import django.db.models.functions.text
from django.db import migrations, models

import django_zerodb.indexes


class Migration(migrations.Migration):
    dependencies = [
        ("difftest", "0003_generic"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="item",
            index=models.Index(
                django.db.models.functions.text.Lower("name"), name="item_lower_name"
            ),
        ),
        migrations.AddIndex(
            model_name="item",
            index=django_zerodb.indexes.TrigramIndex(fields=["code"], name="item_code_trgm"),
        ),
    ]
