"""Integrations of the pipeline with other frameworks, each in a package of its own, imported
only by the applications that use it: ``pipeline.contrib.django`` (Django's task backend, its
worker, its test helper)."""
