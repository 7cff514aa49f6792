"""Sandboxes for agent actions: runtimes (Apptainer, bubblewrap, plain process), the loopback
address allocator, the tool server that runs inside each sandbox, and the image builder.

Kept import-light on purpose: the tool server starts inside every sandbox and imports this
package first, so nothing heavy may be imported here. ``singularity`` never imports
``prorl_celery``, ``api`` or ``handlers``.
"""
