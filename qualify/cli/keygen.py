"""``qualify keygen``: an Ed25519 signing key pair (`manifest.signing`)."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["keygen_cmd"]


@click.command("keygen")
@click.argument("name")
@click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path, file_okay=False),
    default=".",
    show_default=True,
    help="Where to write NAME.key and NAME.pub.",
)
@click.option("--force", is_flag=True, help="Overwrite an existing key pair.")
def keygen_cmd(name: str, directory: Path, force: bool) -> None:
    """Create an Ed25519 signing key pair: NAME.key (mode 600) and NAME.pub."""
    from manifest.signing import generate_keypair, key_id, load_public_key

    directory.mkdir(parents=True, exist_ok=True)
    key_path, pub_path = generate_keypair(name, directory, overwrite=force)
    click.echo(f"private key: {key_path} (keep it secret)")
    click.echo(f"public key:  {pub_path} (ship it to hosts)")
    click.echo(f"key id:      {key_id(load_public_key(pub_path))}")
