"""etrain's web pages under ``/ui/``: static HTML shells, JavaScript modules and CSS.

The pages are authored in this package (``static/``) and call the REST API with
``fetch`` and the token the user signs in with; nothing is loaded from another host.
"""

from service.ui.pages import mount_ui

__all__ = ["mount_ui"]
