"""HTML qualification reports: view models, Jinja2 templates and rendering."""
