"""rbd_client: a Python client for the rbd replay-buffer database.

    from rbd_client import Client
    c = Client("http://127.0.0.1:7450")
    batch = c.sample("demo", batch_size=256, sampler="prioritized")
    batch["observation"], batch["next.observation"], batch["weight"], batch["seq"]

Needs only numpy (torch when asked for tensors). See docs/quickstart.md and
docs/http-api.md in the rbd repository.
"""

from . import safetensors
from .client import Batch, Client, Prefetcher, SampleStream
from .sharded import NoShards, ShardedClient
from .errors import (BadRequest, Conflict, ConnectionFailed, NotFound, NotReady, RateLimited,
                     RbdError, Unauthorized)

__version__ = "0.1.0"

__all__ = ["Client", "ShardedClient", "NoShards", "Batch", "Prefetcher", "SampleStream", "RbdError", "BadRequest", "Unauthorized", "NotFound",
           "Conflict", "NotReady", "RateLimited", "ConnectionFailed", "safetensors", "__version__"]
