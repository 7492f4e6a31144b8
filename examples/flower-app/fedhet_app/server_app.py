"""The ServerApp: fedhet's round driver over the connected SuperNodes."""

from pathlib import Path

from fedhet.engine.flower import deployment_server_app

app = deployment_server_app(Path(__file__).resolve().parent.parent)
