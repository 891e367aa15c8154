// The Jinja engine of chat templates (llm/jinja/): the language's pieces against what Python's Jinja2 prints,
// and the 44 real templates of ../shared/chat-templates with render.py's 8 cases against render.py itself
// (tests/llm/jinja_reference.py runs it over all of them in one process).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "llm/chat_template.h"
#include "llm/jinja/jinja.h"
#include "llm/vocab.h"
#include "loader/gguf.h"
#include "tests/test_models.h"
#include "tests/support/skip.h"

using namespace troupe::llm;
using json = nlohmann::ordered_json;

namespace {

std::string render(const std::string& src, const json& ctx = json::object()) {
  return jinja::template_::parse(src).render(ctx);
}

}  // namespace

TEST_CASE("jinja: output, literals and Python's printing of values", "[jinja]") {
  CHECK(render("Hello {{ name }}!", {{"name", "world"}}) == "Hello world!");
  CHECK(render("{{ 1 }} {{ 1.0 }} {{ 2.5 }} {{ 1e20 }} {{ 0.0001 }} {{ 1e-05 }}") == "1 1.0 2.5 1e+20 0.0001 1e-05");
  CHECK(render("{{ none }} {{ true }} {{ False }}") == "None True False");
  CHECK(render("{{ [1, 'a', none] }} {{ {'k': 'v', 'n': 2} }}") == "[1, 'a', None] {'k': 'v', 'n': 2}");
  CHECK(render("{{ \"it's\" }}|{{ ['it\\'s'] }}") == "it's|[\"it's\"]");
  CHECK(render("{{ missing }}|{{ missing is defined }}") == "|False");
  CHECK(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 'ab' * 3 }}") == "3 -4 2 3.5 1024 ababab");
  CHECK(render("{{ 'a' ~ 1 ~ none }}") == "a1None");
}

TEST_CASE("jinja: whitespace control, trim_blocks and lstrip_blocks as transformers sets them", "[jinja]") {
  CHECK(render("{% if true %}\nyes\n{% endif %}\nafter") == "yes\nafter");
  CHECK(render("a\n    {% if true %}\n    b\n    {% endif %}\nc") == "a\n    b\nc");
  CHECK(render("a  {{- ' b ' -}}  c") == "a b c");
  CHECK(render("x\n  {%+ if true %}y{% endif %}") == "x\n  y");
  CHECK(render("{# a comment #}\nz") == "z");
  CHECK(render("{% raw %}{{ not rendered }}{% endraw %}") == "{{ not rendered }}");
  CHECK(render("last line\n") == "last line");  // the source's one trailing newline goes
}

TEST_CASE("jinja: for loops with loop.*, else, filters in the head, unpacking, break and continue", "[jinja]") {
  CHECK(render("{% for x in xs %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}", {{"xs", {"a", "b", "c"}}}) ==
        "1a,2b,3c");
  CHECK(render("{% for x in [] %}x{% else %}empty{% endfor %}") == "empty");
  CHECK(render("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{% endfor %}") == "24");
  CHECK(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}") == "a=1;b=2;");
  CHECK(render("{% for x in range(10) %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}") ==
        "02");
  CHECK(render("{% for x in 'ab' %}{{ loop.revindex0 }}{{ loop.cycle('o', 'e') }}{% endfor %}") == "1o0e");
}

TEST_CASE("jinja: set, namespace, macros with caller, filter blocks", "[jinja]") {
  CHECK(render("{% set a, b = 1, 2 %}{{ a + b }}") == "3");
  CHECK(render("{% set ns = namespace(n=0) %}{% for x in [1, 2, 3] %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}") == "6");
  CHECK(render("{% set x = 1 %}{% for y in [2] %}{% set x = y %}{% endfor %}{{ x }}") == "1");  // the loop's own scope
  CHECK(render("{% set t %}inner {{ 1 + 1 }}{% endset %}[{{ t }}]") == "[inner 2]");
  CHECK(render("{% macro greet(who, punct='!') %}Hi {{ who }}{{ punct }}{% endmacro %}{{ greet('you') }} {{ greet('all', punct='?') }}") ==
        "Hi you! Hi all?");
  CHECK(render("{% macro box() %}[{{ caller() }}]{% endmacro %}{% call box() %}body{% endcall %}") == "[body]");
  CHECK(render("{% filter upper %}shout{% endfilter %}") == "SHOUT");
}

TEST_CASE("jinja: the filters, tests and methods chat templates use", "[jinja]") {
  const json msgs = json::array({{{"role", "system"}, {"content", " sys "}}, {{"role", "user"}, {"content", "hi"}}});
  CHECK(render("{{ messages | selectattr('role', 'equalto', 'user') | list | length }}", {{"messages", msgs}}) == "1");
  CHECK(render("{{ messages | map(attribute='role') | join(', ') }}", {{"messages", msgs}}) == "system, user");
  CHECK(render("{{ messages[0].content | trim }}|{{ messages[0]['content'].strip() }}", {{"messages", msgs}}) == "sys|sys");
  CHECK(render("{{ {'b': 1, 'a': [1, 'é']} | tojson }}") == "{\"b\": 1, \"a\": [1, \"é\"]}");
  CHECK(render("{{ {'b': 1, 'a': 2} | tojson(indent=2) }}") == "{\n  \"b\": 1,\n  \"a\": 2\n}");
  CHECK(render("{{ {'b': 1, 'a': 2} | dictsort }}") == "[('a', 2), ('b', 1)]");  // tuples, as Python prints them
  CHECK(render("{{ missing | default('d') }} {{ '' | default('e', true) }}") == "d e");
  CHECK(render("{{ 'a\\nb' | indent(2) }}|{{ 'x,y' .split(',') }}|{{ 'Hello'.startswith('He') }}") == "a\n  b|['x', 'y']|True");
  CHECK(render("{{ 'abcdef'[1:3] }}{{ 'abc'[::-1] }}{{ [1, 2, 3][-1] }}") == "bccba3");
  CHECK(render("{{ 3 is divisibleby 3 }} {{ none is none }} {{ 'x' is string }} {{ {} is mapping }} {{ 1 is not number }}") ==
        "True True True True False");
  CHECK(render("{{ d.get('k', 'none') }} {{ 'k' in d }}", {{"d", json::object()}}) == "none False");
  CHECK(render("{{ 'é' | length }} {{ ['a', 'b', 'a'] | unique | list }}") == "1 ['a', 'b']");
  // Bytes that are not UTF-8 count as one character each (the fuzzer's find: an index past the characters).
  CHECK(render("{{ s | length }}|{{ s[2] }}|{{ s[1:] }}", {{"s", std::string("\xe0" "a=b")}}) == "4|=|a=b");
}

TEST_CASE("jinja: refusals are errors naming the line, never crashes: raise_exception, syntax, the sandbox, limits", "[jinja]") {
  CHECK_THROWS_WITH(render("line 1\n{{ raise_exception('no system role') }}"), Catch::Contains("line 2") && Catch::Contains("no system role"));
  CHECK_THROWS_WITH(render("{% if x %}"), Catch::Contains("endif"));
  CHECK_THROWS_WITH(render("{{ x."), Catch::Contains("line 1"));
  CHECK_THROWS_WITH(render("{% frobnicate %}"), Catch::Contains("unknown tag 'frobnicate'"));
  CHECK_THROWS_WITH(render("{{ [].append(1) }}"), Catch::Contains("unsafe"));
  CHECK_THROWS_WITH(render("{{ missing.attr }}"), Catch::Contains("'missing' is undefined"));
  CHECK_THROWS_WITH(render("{{ 1 / 0 }}"), Catch::Contains("division by zero"));
  CHECK_THROWS_WITH(render("{{ 'a' + 1 }}"), Catch::Contains("unsupported operand"));
  // A template that never ends is stopped by the step limit; one that recurses by the depth limit.
  jinja::options o;
  o.max_steps = 100000;
  CHECK_THROWS_WITH(jinja::template_::parse("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", o).render(json::object()),
                    Catch::Contains("steps"));
  CHECK_THROWS_WITH(render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"), Catch::Contains("deeper"));
  CHECK_THROWS_WITH(render("{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}"), Catch::Contains("nest deeper"));
  std::string chain = "{{ 1";
  for (int i = 0; i < 1000; ++i) chain += " + 1";
  CHECK_THROWS_WITH(render(chain + " }}"), Catch::Contains("chained"));
  std::string ifs;
  for (int i = 0; i < 300; ++i) ifs += "{% if true %}";
  CHECK_THROWS_WITH(render(ifs), Catch::Contains("blocks nest deeper"));
  CHECK_THROWS_WITH(render("{{ range(1000000) | length }}"), Catch::Contains("range"));
  jinja::options small;
  small.max_output = 1000;
  CHECK_THROWS_WITH(jinja::template_::parse("{% for i in range(100) %}{{ 'x' * 100 }}{% endfor %}", small).render(json::object()),
                    Catch::Contains("output exceeds"));
  // A string built on the way is bounded too, not only what is printed (the fuzzer's find: joins of joins).
  CHECK_THROWS_WITH(jinja::template_::parse("{% set s = ('ab' * 300) | join('--') %}", small).render(json::object()),
                    Catch::Contains("grows past the output limit"));
}

namespace {

// Renders every template of `dir` with render.py's cases through troupe's engine and through Python's Jinja2
// (tests/llm/jinja_reference.py), and compares: the same bytes, or a refusal on both sides.
void check_against_reference(const std::filesystem::path& dir, size_t expected_pairs) {
  const std::filesystem::path shared = std::filesystem::path(TROUPE_SOURCE_DIR) / ".." / "shared" / "chat-templates";
  if (!std::filesystem::exists(shared / "render.py")) {
    troupe::test::skip_unless_ci("../shared/chat-templates is not here");
    return;
  }
  // The project's .venv (scripts/install-deps puts Jinja2 there), else the system's python3.
  const std::filesystem::path venv = std::filesystem::path(TROUPE_SOURCE_DIR) / ".venv" / "bin" / "python";
  const std::string python = std::filesystem::exists(venv) ? venv.string() : std::string("python3");
  const std::string cmd = python + " " + (std::filesystem::path(TROUPE_SOURCE_DIR) / "tests/llm/jinja_reference.py").string() +
                          " " + dir.string() + " " + (shared / "render.py").string() + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) text.append(buf, n);
  const int status = pclose(pipe);
  if (status != 0) {
    troupe::test::skip_unless_ci("the reference renderer did not run (python3 with jinja2 needed): " + text.substr(0, 300));
    return;
  }
  const json ref = json::parse(text);
  const json& cases = ref["__cases__"];
  size_t pairs = 0, agree = 0, both_refuse = 0;
  std::vector<std::string> disagreements;
  for (auto it = ref.begin(); it != ref.end(); ++it) {
    if (it.key() == "__cases__") continue;
    std::ifstream f(dir / it.key());
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string src = ss.str();
    for (auto c = it.value().begin(); c != it.value().end(); ++c) {
      ++pairs;
      const json& kase = cases[c.key()];
      json ctx = {{"messages", kase["messages"]},
                  {"add_generation_prompt", kase.value("add_generation_prompt", true)},
                  {"bos_token", kase.value("bos_token", "<s>")},
                  {"eos_token", kase.value("eos_token", "</s>")}};
      if (kase.contains("tools") && !kase["tools"].is_null()) ctx["tools"] = kase["tools"];
      if (kase.contains("extra")) {
        for (auto e = kase["extra"].begin(); e != kase["extra"].end(); ++e) ctx[e.key()] = e.value();
      }
      jinja::options o;
      o.fixed_time = 1767323045;  // render.py's 2026-01-02 03:04:05
      bool ok = true;
      std::string got;
      try {
        got = jinja::template_::parse(src, o).render(ctx);
      } catch (const jinja::error& e) {
        ok = false;
        got = e.what();
      }
      const bool ref_ok = c.value()["ok"];
      const std::string want = c.value()["text"];
      if (ok == ref_ok && (!ok || got == want)) {
        ++agree;
        both_refuse += !ok;
        continue;
      }
      std::string what = it.key() + " / " + c.key() + ": ";
      if (ok != ref_ok) {
        what += ok ? "troupe renders '" + got.substr(0, 80) + "', Python refuses (" + want + ")"
                   : "troupe refuses (" + got + "), Python renders '" + want.substr(0, 80) + "'";
      } else {
        size_t at = 0;
        while (at < got.size() && at < want.size() && got[at] == want[at]) ++at;
        what += "differ at byte " + std::to_string(at) + ": troupe '" + got.substr(at > 20 ? at - 20 : 0, 60) + "' Python '" +
                want.substr(at > 20 ? at - 20 : 0, 60) + "'";
      }
      disagreements.push_back(what);
    }
  }
  std::string all;
  for (const std::string& d : disagreements) all += d + "\n";
  INFO(agree << " of " << pairs << " agree (" << both_refuse << " refused on both sides)\n" << all);
  CHECK(pairs == expected_pairs);
  CHECK(agree == pairs);
}

}  // namespace

TEST_CASE("jinja: the 44 real chat templates with render.py's 8 cases print what Python's Jinja2 prints, or refuse where it does", "[jinja][templates]") {
  check_against_reference(std::filesystem::path(TROUPE_SOURCE_DIR) / ".." / "shared" / "chat-templates", 352);
}

TEST_CASE("jinja: 47 snippets of the language's corners (scoping, printing, filters' arguments, whitespace, refusals) print what Python's Jinja2 prints", "[jinja][templates]") {
  check_against_reference(std::filesystem::path(TROUPE_SOURCE_DIR) / "tests" / "data" / "jinja", 47 * 8);
}

TEST_CASE("jinja: SmolLM2's own template through the engine gives the prompts the built-in ChatML family gives, byte for byte", "[jinja][models]") {
  const auto path = troupe::test::smollm2_path();
  if (!path) return;
  const troupe::gguf_file f = troupe::read_gguf(*path);
  const auto src = f.get<std::string>("tokenizer.chat_template");
  REQUIRE(src);
  const jinja::template_ t = jinja::template_::parse(*src);
  const chat_template family(f);
  const vocab v(f);
  const std::vector<std::vector<chat_message>> chats = {
      {{"user", "Hi"}},
      {{"system", "Be brief."}, {"user", "Hi"}},
      {{"system", "Be brief."}, {"user", "Name a colour."}, {"assistant", "Blue."}, {"user", "Another, \"quoted\" & <b> — é"}},
      {{"user", "Hi"}, {"assistant", "Hello."}}};
  for (const auto& chat : chats) {
    for (const bool gen : {true, false}) {
      json messages = json::array();
      for (const chat_message& m : chat) messages.push_back({{"role", m.role}, {"content", m.content}});
      const std::string got = t.render(json{{"messages", messages}, {"add_generation_prompt", gen},
                                            {"bos_token", v.token_to_piece(v.bos(), true)}, {"eos_token", v.token_to_piece(v.eos(), true)}});
      INFO(chat.size() << " messages, generation prompt " << gen);
      CHECK(got == family.apply(chat, gen));
    }
  }
}
