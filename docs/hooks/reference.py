"""mkdocs hook: the configuration reference (reference/configuration.md), generated from the
code at build time by fedhet.reference, so that it follows every option change by itself."""

from __future__ import annotations

from mkdocs.structure.files import File


def on_files(files, config):
    from fedhet.reference import reference_markdown

    files.append(File.generated(config, "reference/configuration.md", content=reference_markdown()))
    return files
