"""The daemon driven by the official `openai` Python client (PyPI), as a user of OpenAI's API would drive it.

Starts a real `troupe serve --config configs/daemon.toml` (its [server] port set to 0 in a temporary copy)
with the fetched SmolLM2 model, and checks the parts of OpenAI's API that troupe implements: chat and
completions, streaming with usage, logprobs (chat and legacy completions), logit_bias, seed, a prompt of
token ids. Run by CTest (`api: openai client`) with the project's virtual environment (.venv, made by
scripts/install-deps). Exit 77 (skipped) without the model or the client, except under CI=true, where
either missing is a failure.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest

ARGS = None
SKIP = 77


def in_ci():
    return os.environ.get("CI") == "true"


def skip_or_fail(why):
    if in_ci():
        print(f"FAIL: {why} (CI=true: this test must run)", file=sys.stderr)
        sys.exit(1)
    print(f"SKIPPED: {why}", file=sys.stderr)
    sys.exit(SKIP)


def example_config(source, model, api_key=None):
    """configs/daemon.toml on any free port, with the model's path made absolute (the copy lives in a
    temporary folder) and, when given, one API key."""
    with open(os.path.join(source, "configs", "daemon.toml")) as f:
        config = f.read()
    config = re.sub(r"(?m)^port = [0-9]+", "port = 0", config, count=1)
    config = re.sub(r'(?m)^path = "[^"]*"', 'path = "' + model + '"', config, count=1)
    if api_key is not None:
        config = re.sub(r"(?m)^api_keys = \[\]", f'api_keys = ["{api_key}"]', config, count=1)
    return config


class Daemon:
    def __init__(self, troupe, config_text, cwd):
        self.dir = tempfile.TemporaryDirectory()
        path = os.path.join(self.dir.name, "daemon.toml")
        with open(path, "w") as f:
            f.write(config_text)
        self.log = open(os.path.join(self.dir.name, "stderr"), "w+")
        self.proc = subprocess.Popen([troupe, "serve", "--config", path], cwd=cwd, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        self.port = None
        while time.monotonic() < deadline and self.port is None:
            if self.proc.poll() is not None:
                raise RuntimeError("troupe serve exited: " + self.text())
            m = re.search(r"listening on http://127\.0\.0\.1:([0-9]+)", self.text())
            if m:
                self.port = int(m.group(1))
            else:
                time.sleep(0.1)
        if self.port is None:
            raise RuntimeError("troupe serve did not start: " + self.text())

    def text(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        self.dir.cleanup()


class OpenAIClient(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import openai
        cls.daemon = Daemon(ARGS.troupe, example_config(ARGS.source, ARGS.model), ARGS.source)
        cls.client = openai.OpenAI(base_url=f"http://127.0.0.1:{cls.daemon.port}/v1", api_key="none",
                                   max_retries=0, timeout=120)
        cls.model = "smollm2"

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def chat(self, **kw):
        kw.setdefault("messages", [{"role": "user", "content": "What is the capital of France?"}])
        kw.setdefault("max_tokens", 12)
        return self.client.chat.completions.create(model=self.model, **kw)

    def test_models(self):
        ids = [m.id for m in self.client.models.list()]
        self.assertIn(self.model, ids)

    def test_chat_and_stream_with_usage(self):
        plain = self.chat(temperature=0)
        self.assertTrue(plain.choices[0].message.content)
        self.assertEqual(plain.usage.completion_tokens, 12)
        text, usage = "", None
        for chunk in self.chat(temperature=0, stream=True, stream_options={"include_usage": True}):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage:
                usage = chunk.usage
        self.assertEqual(text, plain.choices[0].message.content)
        self.assertEqual(usage.completion_tokens, 12)

    def test_chat_logprobs(self):
        r = self.chat(temperature=0, logprobs=True, top_logprobs=2)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), r.usage.completion_tokens)
        for t in content:
            self.assertLessEqual(t.logprob, 0.0)
            self.assertEqual(len(t.top_logprobs), 2)
            self.assertGreaterEqual(t.top_logprobs[0].logprob, t.top_logprobs[1].logprob)
            # Temperature 0: the first of top_logprobs is the sampled token.
            self.assertEqual(t.top_logprobs[0].token, t.token)
            self.assertEqual(t.top_logprobs[0].logprob, t.logprob)
            self.assertLessEqual(math.exp(t.top_logprobs[0].logprob) + math.exp(t.top_logprobs[1].logprob), 1.0 + 1e-6)
        self.assertEqual("".join(t.token for t in content), r.choices[0].message.content)
        # Streamed, the chunks' entries together are the plain answer's.
        streamed = []
        for chunk in self.chat(temperature=0, logprobs=True, top_logprobs=2, stream=True):
            if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
                streamed.extend(chunk.choices[0].logprobs.content)
        self.assertEqual([(t.token, t.logprob) for t in streamed], [(t.token, t.logprob) for t in content])

    def test_completions_legacy_logprobs_and_token_prompt(self):
        r = self.client.completions.create(model=self.model, prompt="The capital of France is", max_tokens=6,
                                           temperature=0, logprobs=3)
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 6)
        self.assertTrue(all(v <= 0.0 for v in lp.token_logprobs))
        self.assertTrue(all(len(top) <= 3 for top in lp.top_logprobs))
        self.assertEqual(lp.text_offset[0], 0)
        # A prompt of token ids (here the ids of an earlier answer, return_tokens): used as given.
        ids = self.client.completions.create(model=self.model, prompt="The capital of France is", max_tokens=5,
                                             temperature=0, extra_body={"return_tokens": True}).model_dump()["choices"][0]["tokens"]
        self.assertEqual(len(ids), 5)
        r2 = self.client.completions.create(model=self.model, prompt=ids, max_tokens=4, temperature=0)
        r3 = self.client.completions.create(model=self.model, prompt=[ids], max_tokens=4, temperature=0)
        self.assertEqual(r2.usage.prompt_tokens, len(ids))
        self.assertEqual(r2.choices[0].text, r3.choices[0].text)
        import openai
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model=self.model, prompt=[1, 10**8], max_tokens=1)
        self.assertIn("outside the vocabulary", str(e.exception))

    def test_logit_bias_and_seed(self):
        first = self.chat(temperature=0, max_tokens=1, logprobs=True)
        banned = self.chat(temperature=0, max_tokens=1, logprobs=True,
                           logit_bias={str(self.token_id(first)): -100})
        self.assertNotEqual(banned.choices[0].logprobs.content[0].token, first.choices[0].logprobs.content[0].token)
        a = self.chat(temperature=1.0, seed=1234)
        b = self.chat(temperature=1.0, seed=1234)
        self.assertEqual(a.choices[0].message.content, b.choices[0].message.content)

    def token_id(self, reply):
        # The daemon's return_tokens extension (extra_body) gives the ids of an answer.
        r = self.client.chat.completions.create(model=self.model, messages=[
            {"role": "user", "content": "What is the capital of France?"}], max_tokens=1, temperature=0,
            extra_body={"return_tokens": True})
        return r.model_dump()["choices"][0]["tokens"][0]

    def test_json_object_answers_parse(self):
        # Temperature 1: the grammar, not luck, makes every answer JSON (and closes it before max_tokens).
        for seed in range(20):
            r = self.chat(messages=[{"role": "user", "content": "Describe a cat as JSON."}], temperature=1.0, seed=seed,
                          max_tokens=60, response_format={"type": "json_object"})
            text = r.choices[0].message.content
            self.assertIsInstance(json.loads(text), dict, text)
            self.assertEqual(r.choices[0].finish_reason, "stop", text)

    def test_json_schema_answers_validate(self):
        import jsonschema
        schema = {"type": "object",
                  "properties": {"name": {"type": "string", "maxLength": 40},
                                 "age": {"type": "integer"},
                                 "height": {"type": "number"},
                                 "pet": {"type": "boolean"},
                                 "color": {"enum": ["red", "green", "blue"]},
                                 "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 1, "maxItems": 3},
                                 "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                                             "required": ["city"]},
                                 "nickname": {"anyOf": [{"type": "string", "maxLength": 20}, {"type": "null"}]}},
                  "required": ["name", "age", "color", "tags", "address"], "additionalProperties": False}
        for seed in range(20):
            r = self.chat(messages=[{"role": "user", "content": "Describe a person."}], temperature=1.0, seed=seed,
                          max_tokens=120,
                          response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
            text = r.choices[0].message.content
            jsonschema.validate(json.loads(text), schema)
        import openai
        with self.assertRaises(openai.BadRequestError) as e:
            self.chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
                "type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}}}})
        self.assertIn("minimum", str(e.exception))
        self.assertIn("properties.age.minimum", str(e.exception))

    def test_required_tool_call(self):
        tools = [{"type": "function", "function": {
            "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
                           "required": ["city", "unit"]}}},
                 {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        r = self.chat(messages=messages, tools=tools, tool_choice="required", parallel_tool_calls=False,
                      max_tokens=80, temperature=0)
        choice = r.choices[0]
        self.assertEqual(choice.finish_reason, "tool_calls")
        self.assertEqual(len(choice.message.tool_calls), 1)
        call = choice.message.tool_calls[0]
        self.assertIn(call.function.name, ("get_weather", "get_time"))
        args = json.loads(call.function.arguments)
        if call.function.name == "get_weather":
            self.assertIn(args["unit"], ("celsius", "fahrenheit"))
        # A named function, streamed: the call arrives as a tool_calls delta.
        # As OpenAI streams a call: the first delta of an index has its id and name (arguments ""), the later
        # ones pieces of the arguments.
        calls = {}
        finish = None
        for chunk in self.chat(messages=messages, tools=tools, max_tokens=80, temperature=0, stream=True,
                               tool_choice={"type": "function", "function": {"name": "get_weather"}}):
            if chunk.choices:
                for d in chunk.choices[0].delta.tool_calls or []:
                    if d.index not in calls:
                        self.assertTrue(d.id)
                        self.assertEqual(d.function.arguments, "")
                        calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
                    else:
                        self.assertIsNone(d.id)
                        calls[d.index]["arguments"] += d.function.arguments
                finish = chunk.choices[0].finish_reason or finish
        self.assertEqual(finish, "tool_calls")
        self.assertEqual(calls[0]["name"], "get_weather")
        self.assertIsInstance(json.loads(calls[0]["arguments"])["city"], str)
        # The call and its result go back into the conversation; the model answers in text.
        follow = messages + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": "{\"temperature\": 21}"}]
        r2 = self.chat(messages=follow, tools=tools, tool_choice="none", max_tokens=20, temperature=0)
        self.assertTrue(r2.choices[0].message.content)
        self.assertIsNone(r2.choices[0].message.tool_calls)

    def test_responses_plain_streamed_stored_and_a_function_call(self):
        import openai
        question = "What is the capital of France?"
        r = self.client.responses.create(model=self.model, input=question, max_output_tokens=30, temperature=0)
        self.assertTrue(r.id.startswith("resp_"))
        self.assertEqual(r.object, "response")
        self.assertIn(r.status, ("completed", "incomplete"))
        self.assertTrue(r.output_text)
        self.assertGreater(r.usage.input_tokens, 0)
        self.assertGreater(r.usage.output_tokens, 0)
        # Streamed: the Responses events, in order, adding up to the same text.
        types, text = [], ""
        for e in self.client.responses.create(model=self.model, input=question, max_output_tokens=30, temperature=0, stream=True):
            types.append(e.type)
            if e.type == "response.output_text.delta":
                text += e.delta
        self.assertEqual(types[:2], ["response.created", "response.in_progress"])
        self.assertIn(types[-1], ("response.completed", "response.incomplete"))
        self.assertLess(types.index("response.output_item.added"), types.index("response.output_text.delta"))
        self.assertEqual(text, r.output_text)
        # Stored: retrieved by id, deleted.
        self.assertEqual(self.client.responses.retrieve(r.id).output_text, r.output_text)
        self.client.responses.delete(r.id)
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.retrieve(r.id)
        # A function call, its output sent back by previous_response_id, answered in text.
        tools = [{"type": "function", "name": "get_weather", "description": "Current weather of a city",
                  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
        call = self.client.responses.create(model=self.model, input="What is the weather in Paris?", tools=tools,
                                            tool_choice="required", max_output_tokens=60, temperature=0)
        calls = [o for o in call.output if o.type == "function_call"]
        self.assertEqual(len(calls), 1)
        self.assertEqual(calls[0].name, "get_weather")
        self.assertIsInstance(json.loads(calls[0].arguments)["city"], str)
        follow = self.client.responses.create(model=self.model, previous_response_id=call.id, tools=tools, tool_choice="none",
                                              input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "21 C, sunny"}],
                                              max_output_tokens=30, temperature=0)
        self.assertTrue(follow.output_text)
        self.assertEqual(follow.previous_response_id, call.id)
        # The follow-up's prompt holds the first turn: more input tokens than the question alone.
        alone = self.client.responses.create(model=self.model, input="What is the weather in Paris?", max_output_tokens=1)
        self.assertGreater(follow.usage.input_tokens, alone.usage.input_tokens + 10)
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.create(model=self.model, input="x", previous_response_id="resp_nope")
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.responses.create(model=self.model, input=[{"type": "telepathy"}])
        self.assertIn("input[0].type", str(e.exception))

    def test_n_choices_share_one_prefill(self):
        one = self.chat(temperature=0, max_tokens=10)
        two = self.chat(temperature=0, max_tokens=10, n=2)
        self.assertEqual([c.index for c in two.choices], [0, 1])
        # Greedy: both choices are the single answer (the shared cells hold what the prefill wrote).
        for c in two.choices:
            self.assertEqual(c.message.content, one.choices[0].message.content)
        self.assertEqual(two.usage.completion_tokens, 20)
        sampled = self.chat(temperature=1.0, seed=7, max_tokens=16, n=2)
        self.assertEqual(len(sampled.choices), 2)
        self.assertNotEqual(sampled.choices[0].message.content, sampled.choices[1].message.content)
        # Streamed: chunks carry their choice's index; each choice's text is whole.
        texts = {0: "", 1: ""}
        for chunk in self.chat(temperature=0, max_tokens=10, n=2, stream=True):
            for c in chunk.choices:
                texts[c.index] += c.delta.content or ""
        self.assertEqual(texts[0], one.choices[0].message.content)
        self.assertEqual(texts[1], one.choices[0].message.content)

    def test_embeddings(self):
        r = self.client.embeddings.create(model=self.model, input=["The cat sat on the mat.", "A cat sat on a mat.",
                                                                   "Stock markets fell sharply today."])
        self.assertEqual([d.index for d in r.data], [0, 1, 2])
        vecs = [d.embedding for d in r.data]
        self.assertEqual(len(vecs[0]), 576)  # SmolLM2-135M's width
        for v in vecs:
            self.assertAlmostEqual(sum(x * x for x in v), 1.0, places=4)
        dot = lambda a, b: sum(x * y for x, y in zip(a, b))
        self.assertGreater(dot(vecs[0], vecs[1]), dot(vecs[0], vecs[2]))
        self.assertGreater(r.usage.prompt_tokens, 0)
        # One input alone gives the same vector; base64 (the client's default wire format) decodes to it too.
        alone = self.client.embeddings.create(model=self.model, input="The cat sat on the mat.", encoding_format="float")
        for a, b in zip(alone.data[0].embedding, vecs[0]):
            self.assertAlmostEqual(a, b, places=5)
        import base64
        import struct
        raw = self.client.embeddings.with_raw_response.create(model=self.model, input="The cat sat on the mat.",
                                                              encoding_format="base64")
        b64 = json.loads(raw.text)["data"][0]["embedding"]
        floats = struct.unpack("<%df" % 576, base64.b64decode(b64))
        for a, b in zip(floats, alone.data[0].embedding):
            self.assertAlmostEqual(a, b, places=6)
        import openai
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.embeddings.create(model=self.model, input=[])
        self.assertIn("input", str(e.exception))

    def test_bad_requests_are_400s_naming_the_field(self):
        import openai
        with self.assertRaises(openai.BadRequestError) as e:
            self.chat(top_logprobs=2)
        self.assertIn("top_logprobs", str(e.exception))
        with self.assertRaises(openai.BadRequestError) as e:
            self.chat(logit_bias={"999999": 5})
        self.assertIn("logit_bias", str(e.exception))
        with self.assertRaises(openai.BadRequestError) as e:
            self.chat(extra_body={"grammar": "root ::= undefined-rule"})
        self.assertIn("undefined-rule", str(e.exception))
        with self.assertRaises(openai.BadRequestError) as e:
            self.chat(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice={"type": "function", "function": {"name": "g"}})
        self.assertIn("tool_choice", str(e.exception))


def main_for(test_globals, package):
    """The main of an API test module: --troupe and --source, the venv's interpreter when `package` is not
    importable here, the fetched SmolLM2; sets the module's ARGS and runs its test cases."""
    p = argparse.ArgumentParser()
    p.add_argument("--troupe", required=True)
    p.add_argument("--source", required=True)
    args, rest = p.parse_known_args()
    args.troupe = os.path.abspath(args.troupe)
    args.source = os.path.abspath(args.source)
    try:
        __import__(package)
    except ImportError:
        venv_python = os.path.join(args.source, ".venv", "bin", "python")
        if os.path.isfile(venv_python) and os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(args.source, ".venv")):
            os.execv(venv_python, [venv_python] + sys.argv)
        skip_or_fail(f"the {package} package is not installed (scripts/install-deps makes .venv with it)")
    args.model = os.path.join(args.source, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.isfile(args.model):
        skip_or_fail(f"{args.model} is missing (scripts/fetch-model downloads it)")
    test_globals["ARGS"] = args
    r = unittest.main(module=test_globals["__name__"], argv=[sys.argv[0]] + rest, exit=False, verbosity=2).result
    sys.exit(0 if r.wasSuccessful() else 1)


def main():
    main_for(globals(), "openai")


if __name__ == "__main__":
    main()
