"""llama-server and llama-cli from ggufbridge's side, in three parts:

- `argv`: the command lines, from a recipe, a memory plan and a converted folder (pure; tested without processes);
- `process`: starting a tool so that it never outlives us, waiting for /health, reading why it stopped;
- `client`: the HTTP requests ggufbridge sends to a running server.

The names below are the package's interface (`from ggufbridge.runtime import server as sv; sv.server_argv(...)`).
"""

from ggufbridge.runtime.server.argv import (SERVE_N_PREDICT, ServeOptions, cli_argv, device_args, model_alias,
                                            parse_rpc, plan_devices, printable, reasoning_args, server_argv)
from ggufbridge.runtime.server.client import chat, chat_stream, complete_stream, http_json, metrics, tokenize
from ggufbridge.runtime.server.process import (Server, check_bindable, free_port, log_has_error, log_last,
                                               log_reason, log_tail, signal_group, spawn, stop)

__all__ = ["SERVE_N_PREDICT", "ServeOptions", "Server", "chat", "chat_stream", "check_bindable", "cli_argv",
           "complete_stream", "device_args", "free_port", "http_json", "log_has_error", "log_last", "log_reason",
           "log_tail", "metrics", "model_alias", "parse_rpc", "plan_devices", "printable", "reasoning_args",
           "server_argv", "signal_group", "spawn", "stop", "tokenize"]
