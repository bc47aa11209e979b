"""torchrun, unchanged, with incarnations numbered by rendezvous round:

    python -m chaosbench.launchers.elastic <torchrun arguments>

torch elastic's ``TORCHELASTIC_RESTART_COUNT`` does not count restarts caused by membership changes and starts
at 0 on a node that joins later, so it cannot number a multi-node job's incarnations. This launcher only sets
``CHAOSBENCH_INCARNATION`` in the agent before each worker start, so that the probe's incarnation
(CHAOSBENCH_INCARNATION + TORCHELASTIC_RESTART_COUNT) is the rendezvous round, the same on every node. Used by
the ``torchrun`` adapter with several agents and by ``torchrun-elastic``; ``chaosbench.launchers.nvrx`` does the
same for ft_launcher.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def install_round_incarnation(agent_cls: Any = None) -> None:
    """Make every worker group an agent (``agent_cls``: torch's LocalElasticAgent, or a launcher's subclass of it)
    starts carry ``CHAOSBENCH_INCARNATION`` such that the probe's incarnation (CHAOSBENCH_INCARNATION +
    TORCHELASTIC_RESTART_COUNT) is the rendezvous round, the same on every node. The worker's environment is the
    agent's plus its own variables, so setting the variable in this process before each start is enough. Uses
    the dynamic rendezvous handler's state (torch 2.x); when that is not there, nothing changes."""
    if agent_cls is None:
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

        agent_cls = LocalElasticAgent
    original = getattr(agent_cls, "_start_workers", None)
    if original is None:
        return
    # The round is the job's incarnation on every node, whatever the harness set: an agent the runtime reran on
    # a node that came back (docker's lost-node reboot bumps CHAOSBENCH_INCARNATION for agents that cannot
    # number rounds) joins the same round as the agents that never died.

    def _start_workers(self: Any, worker_group: Any) -> Any:
        spec = worker_group.spec
        holder = getattr(spec.rdzv_handler, "_state_holder", None)
        rnd = getattr(getattr(holder, "state", None), "round", None)
        if isinstance(rnd, int):
            restart_count = spec.max_restarts - self._remaining_restarts
            os.environ["CHAOSBENCH_INCARNATION"] = str(rnd - restart_count)
        return original(self, worker_group)

    agent_cls._start_workers = _start_workers


def main(argv: list[str] | None = None) -> None:
    from torch.distributed.run import main as torchrun_main

    install_round_incarnation()
    torchrun_main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
