# SPDX-License-Identifier: Apache-2.0
"""Qwen3 special-token IDs and a sample tool, shared by the CPU tests and benchmarks (tiny model's vocabulary)."""

IM_START, IM_END, ENDOFTEXT = 151644, 151645, 151643  # IM_END is the EOS and the chat template's turn terminator
TOOL_CALL, TOOL_CALL_END, THINK, THINK_END = 151657, 151658, 151667, 151668

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
