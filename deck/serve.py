"""daphne with compressed websocket frames: ``python -m deck.serve [daphne's arguments]``.

daphne 4.2 configures autobahn's websocket factory without a ``perMessageCompressionAccept`` and has no
option for one, so ``permessage-deflate`` is never negotiated and every live frame of the Deck travels
uncompressed. This entry point is daphne's own command line with one change: the factory accepts a
browser's ``permessage-deflate`` offer. Everything else (arguments, protocols, logging) is daphne's.
"""

from __future__ import annotations

import sys
from typing import Any

from autobahn.websocket.compress import PerMessageDeflateOffer, PerMessageDeflateOfferAccept
from daphne import server
from daphne.cli import CommandLineInterface
from daphne.ws_protocol import WebSocketFactory


def accept_deflate(offers: list[Any]) -> PerMessageDeflateOfferAccept | None:
    """The first ``permessage-deflate`` offer of a client, accepted as offered (None: frames stay plain)."""
    for offer in offers:
        if isinstance(offer, PerMessageDeflateOffer):
            return PerMessageDeflateOfferAccept(offer)
    return None


class DeflatingWebSocketFactory(WebSocketFactory):  # type: ignore[misc]  # autobahn/daphne are untyped
    """daphne's factory, told to accept ``permessage-deflate`` whenever daphne sets its options."""

    def setProtocolOptions(self, **options: Any) -> None:  # autobahn's name
        options.setdefault("perMessageCompressionAccept", accept_deflate)
        super().setProtocolOptions(**options)


def main(argv: list[str] | None = None) -> None:
    server.WebSocketFactory = DeflatingWebSocketFactory  # daphne's Server builds its factory by this name
    CommandLineInterface().run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
