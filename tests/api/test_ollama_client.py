"""The daemon driven by the official `ollama` Python client (PyPI), as the tools that speak ollama drive it.

Starts a real `troupe serve --config configs/daemon.toml` (port 0, the fetched SmolLM2, with the alias
"smollm2:135m") and checks ollama's API as troupe implements it: chat plain and streamed (NDJSON), generate,
list (tags), show, embed, ps, version, a tool call, format "json", the model's alias and NAME:latest, and
errors as {"error": ...} (an unknown model, pull). Run by CTest (`api: ollama client`) with the project's
virtual environment; exit 77 (skipped) without the model or the client, except under CI=true.
"""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_openai_client as common  # noqa: E402  (the Daemon helper and the skip rules)

ARGS = None
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


class OllamaClient(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import ollama
        config = common.example_config(ARGS.source, ARGS.model)
        config = config.replace('name = "smollm2"', 'name = "smollm2"\naliases = ["smollm2:135m"]', 1)
        cls.daemon = common.Daemon(ARGS.troupe, config, ARGS.source)
        cls.client = ollama.Client(host=f"http://127.0.0.1:{cls.daemon.port}", timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def test_chat_plain_and_streamed(self):
        r = self.client.chat(model="smollm2:135m", messages=QUESTION, options={"temperature": 0, "num_predict": 30})
        self.assertEqual(r.message.role, "assistant")
        self.assertTrue(r.message.content)
        self.assertTrue(r.done)
        self.assertIn(r.done_reason, ("stop", "length"))
        self.assertGreater(r.prompt_eval_count, 0)
        self.assertGreater(r.eval_count, 0)
        self.assertGreater(r.total_duration, 0)
        parts = list(self.client.chat(model="smollm2:latest", messages=QUESTION, stream=True,
                                      options={"temperature": 0, "num_predict": 30}))
        self.assertTrue(all(not p.done for p in parts[:-1]))
        self.assertTrue(parts[-1].done)
        self.assertEqual("".join(p.message.content for p in parts), r.message.content)
        self.assertEqual(parts[-1].eval_count, r.eval_count)

    def test_generate_and_format_json(self):
        r = self.client.generate(model="smollm2", prompt="Name a colour.", options={"temperature": 0, "num_predict": 20})
        self.assertTrue(r.response)
        self.assertTrue(r.done)
        raw = self.client.generate(model="smollm2", prompt="Once upon a time", raw=True, options={"temperature": 0, "num_predict": 8})
        self.assertTrue(raw.response)
        j = self.client.chat(model="smollm2", messages=[{"role": "user", "content": "Describe Paris as JSON."}], format="json",
                             options={"temperature": 0, "num_predict": 60})
        self.assertIsInstance(json.loads(j.message.content), dict)

    def test_tool_call(self):
        tools = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                                  "required": ["city"]}}}]
        # ollama has no tool_choice: a model decides; SmolLM2 called or answered, either must be well formed.
        r = self.client.chat(model="smollm2", messages=[{"role": "user", "content": "What is the weather in Paris? Use the tool."}],
                             tools=tools, options={"temperature": 0, "num_predict": 60})
        for c in r.message.tool_calls or []:
            self.assertEqual(c.function.name, "get_weather")
            self.assertIsInstance(c.function.arguments, dict)
        follow = [{"role": "user", "content": "What is the weather in Paris?"},
                  {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                  {"role": "tool", "content": "21 C, sunny", "tool_name": "get_weather"}]
        r2 = self.client.chat(model="smollm2", messages=follow, options={"temperature": 0, "num_predict": 30})
        self.assertTrue(r2.message.content)

    def test_list_show_ps_embed_version(self):
        names = [m.model for m in self.client.list().models]
        self.assertIn("smollm2:latest", names)
        self.assertIn("smollm2:135m", names)
        shown = self.client.show("smollm2")
        self.assertEqual(shown.details.format, "gguf")
        self.assertEqual(shown.details.family, "llama")
        self.assertIn("completion", shown.capabilities)
        self.assertIn("im_start", shown.template)
        self.assertEqual(shown.modelinfo["general.architecture"], "llama")
        # `ollama run` loads the model first: a request with no prompt / messages is answered at once.
        self.assertEqual(self.client.generate(model="smollm2").done_reason, "load")
        self.assertEqual(self.client.chat(model="smollm2:135m", messages=[]).done_reason, "load")
        running = [m.model for m in self.client.ps().models]
        self.assertEqual(running, ["smollm2:latest"])
        e = self.client.embed(model="smollm2", input=["Hello", "World"])
        self.assertEqual(len(e.embeddings), 2)
        self.assertEqual(len(e.embeddings[0]), 576)
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{self.daemon.port}/api/version") as v:
            self.assertTrue(json.loads(v.read())["version"])

    def test_errors(self):
        import ollama
        with self.assertRaises(ollama.ResponseError) as e:
            self.client.chat(model="no-such-model", messages=QUESTION)
        self.assertEqual(e.exception.status_code, 404)
        self.assertIn("no-such-model", e.exception.error)
        with self.assertRaises(ollama.ResponseError) as e:
            self.client.pull("llama3")
        self.assertIn("[[model]]", e.exception.error)
        with self.assertRaises(ollama.ResponseError) as e:
            self.client.chat(model="smollm2", messages=[{"role": "user", "content": "x", "images": ["AAAA"]}])
        self.assertEqual(e.exception.status_code, 400)


def main():
    common.main_for(globals(), "ollama")


if __name__ == "__main__":
    main()
