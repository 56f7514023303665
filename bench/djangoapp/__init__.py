"""The models of ``bench.django_side_by_side``: one schema, created in every database."""
