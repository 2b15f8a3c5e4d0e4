"""``python -m hetero_replay.apps.zoo [train|enjoy] <rl-zoo3 arguments>``."""

from hetero_replay.apps.zoo import main

main()
