"""``python -m vllm_rl.integrations.verl``: check that verl sees vllm_rl (exit 1 if not).

``--router-config`` prints the path of the router YAML for ``rollout.router_config_path``.
"""
import sys

from vllm_rl.integrations.verl import CHECKED, ROUTER_CONFIG, check_registered, verl_version

if __name__ == "__main__":
    if sys.argv[1:] == ["--router-config"]:
        print(ROUTER_CONFIG)
        sys.exit(0)
    try:
        check_registered()
    except Exception as e:          # noqa: BLE001 - the message is the report
        print(f"vllm_rl is NOT registered with verl {verl_version()}: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"vllm_rl is registered with verl {verl_version()} (checked: {', '.join(CHECKED)})")
