"""weights.mode files: the trainer serves its version dirs on transport.weights_addr
(grpo.weights.files), and each sampler copies a version into its own run dir before reading it
as shared_dir does."""

from __future__ import annotations

import threading
from collections.abc import Callable

import zmq

from grpo.config import Config
from grpo.weights.files import MAX_REQUEST_BYTES, WeightFetcher
from grpo.weights.files import serve as serve_dirs
from grpo.weights.modes.base import Mode, SamplerLink, ServingEnd, Unavailable
from grpo.weights.modes.shared_dir import DirReceiver
from grpo.weights.version import Version


class DirServer(ServingEnd):
    """Serves the run's version dirs, file by file."""

    max_request_bytes = MAX_REQUEST_BYTES

    def serve(
        self, router: zmq.Socket, closing: threading.Event, failed: Callable[[str], None]
    ) -> None:
        serve_dirs(router, self.cfg.run_dir, closing, failed)


class FetchingReceiver(DirReceiver):
    def __init__(self, cfg: Config, link: SamplerLink):
        super().__init__(link.run_dir)
        t = cfg.transport
        self.keep = cfg.train.keep_versions
        self.fetcher = WeightFetcher(
            link.ctx,
            t.weights_addr,
            t.peer_timeout_s,
            link.secure,
            link.limits,
            t.max_version_bytes,
        )

    def get(self, number: int) -> Version:
        try:
            self.fetcher.fetch(self.run_dir, number, self.keep)
        except ValueError as e:
            raise Unavailable(str(e)) from None
        return super().get(number)

    def close(self) -> None:
        self.fetcher.close()


MODE = Mode("files", from_memory=False, trainer_end=DirServer, receiver=FetchingReceiver)
