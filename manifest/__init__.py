"""Release manifests: decision policy, build, signing, verification, diff and host-side resolve.

Importing this package imports nothing heavy: ``manifest.resolve`` runs on every host at every
service start and must stay on the standard library (plus ``cryptography`` for Ed25519).
"""
