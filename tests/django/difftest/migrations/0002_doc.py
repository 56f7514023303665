from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("difftest", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="Doc",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("value", models.JSONField(null=True)),
                ("n", models.IntegerField(null=True)),
            ],
        ),
    ]
