set -e
umask 077
mkdir -p '/home/corral/.codex'
printf '%s' 'model = "corral-synthetic"
model_catalog_json = "/home/corral/.codex/corral-models.json"
model_provider = "corral"
check_for_update_on_startup = false
approval_policy = "never"
sandbox_mode = "danger-full-access"

[model_providers.corral]
name = "corral"
base_url = "http://127.0.0.1:3128/routes/synthetic/v1"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 90000

[analytics]
enabled = false

[features]
plugins = false

[history]
persistence = "none"

[mcp_servers.demo]
url = "http://127.0.0.1:3128/routes/mcp/demo/mcp"
required = true
startup_timeout_sec = 30
tool_timeout_sec = 120
default_tools_approval_mode = "approve"
' > '/home/corral/.codex/config.toml'
printf '%s' '{
 "models": [
  {
   "apply_patch_tool_type": "freeform",
   "base_instructions": "You are a coding agent driven by corral'"'"'s synthetic provider.",
   "context_window": 272000,
   "default_reasoning_level": "medium",
   "description": "corral'"'"'s scripted provider",
   "display_name": "corral synthetic",
   "experimental_supported_tools": [],
   "input_modalities": [
    "text"
   ],
   "priority": 1,
   "shell_type": "shell_command",
   "slug": "corral-synthetic",
   "support_verbosity": false,
   "supported_in_api": true,
   "supported_reasoning_levels": [],
   "supports_parallel_tool_calls": false,
   "supports_reasoning_summaries": false,
   "supports_search_tool": false,
   "truncation_policy": {
    "limit": 10000,
    "mode": "tokens"
   },
   "visibility": "list"
  }
 ]
}
' > '/home/corral/.codex/corral-models.json'
export CODEX_HOME='/home/corral/.codex'
export CODEX_MANAGED_BY_NPM='1'
export NO_COLOR='1'
cd '/srv/ws'
exec "$@"
