"""The ClientApp: trains this SuperNode's partition on the tasks the ServerApp sends."""

from pathlib import Path

from fedhet.engine.flower import deployment_client_app

app = deployment_client_app(Path(__file__).resolve().parent.parent)
