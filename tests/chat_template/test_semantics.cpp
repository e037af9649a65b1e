// A table of small templates covering the language (whitespace control,
// literals, operators, filters, tests, loops, scoping, macros, methods,
// Undefined, Markup, tojson, formatting, errors), each rendered by our
// renderer and by Python's jinja2 (scripts/render_chat_templates.py --cases)
// at test time: outputs must be byte-identical, or both must fail.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "reference.h"
#include "tokenizer/chat_template/chat_template.h"

namespace serval {
namespace {

const char* const kContext = R"J({
  "s": "Hello World", "n": 42, "f": 3.5, "neg": -7, "t": true, "nil": null,
  "lst": [3, 1, 2], "words": ["b", "A", "c", "a"],
  "d": {"b": 2, "a": 1, "items": "key-named-items"},
  "users": [{"name": "Ann", "age": 30, "tags": ["x"]}, {"name": "bob", "age": 25},
            {"name": "Cid", "age": 30, "active": true}],
  "nested": {"x": {"y": [10, 20, {"z": "deep"}]}},
  "u": "h\u00e9llo w\u00f6rld \u00c9COLE \u00df \u0130",
  "empty": "", "ws": "  \t padded \n ", "multiline": "line1\nline2\n\nline4",
  "big": 9007199254740993, "tiny": 1e-300, "huge": 1.7976931348623157e308,
  "messages": [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "<tool_response>x</tool_response>"},
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nanswer", "reasoning_content": null},
    {"role": "user", "content": [{"type": "text", "text": " part1 "}, {"type": "image"}, {"type": "text", "text": "part2"}]}
  ]
})J";

const std::vector<std::string> kCases = {
    // --- whitespace control (trim_blocks, lstrip_blocks, -, +) ---
    "a\n  {% if true %}\n  b\n  {% endif %}\n c",
    "a  {%- if true %} b {% endif -%}  c",
    "  {%+ if true %}x{% endif %}",
    "{% if true +%}\nx{% endif %}",
    "x  {# comment #}\n y",
    "x\n  {#- c -#}  \n y",
    "x\n  {# c +#}\ny",
    "{% raw %}{{ not processed }}{% endraw %}",
    "  {% raw -%}  a  {%- endraw %}  ",
    "a\n  {% raw %}\n  {{ x }}\n  {% endraw %}\nb",
    "line\r\nnext\r\n{% if true %}\r\nA\r\n{% endif %}\r\nend\rold mac\r",
    "trailing\n",
    "trailing\n\n",
    "  {{ s }}  \n  {% set x = 1 %}  \n{{ x }}",
    "text {% if true %}\n   inside\n{% endif %}",
    "{%- for i in lst -%}\n  {{ i }}\n{%- endfor %}",
    "{% for i in lst %}\n    {{ i }}\n{% endfor %}\n",
    "a {{- ' b ' -}} c",
    "\t{% if 1 %}tab{% endif %}",
    "x\n\u00a0 {% if 1 %}nbsp{% endif %}",
    "x\n\u3000{% if 1 %}ideographic{% endif %}",
    "{% if 1 %}\n\n{% endif %}\n\n",
    "{{ '{{' }}}} {{ '{%' }} %}",
    "{{ {'a': {'b': 1}} }}",
    "{#- only a comment -#}",
    "a{# multi\nline\ncomment #}b",
    "{{- 'x' -}}\n\n  {{- 'y' }}",
    "  {%- if true %}\n  x\n  {%- endif %}\n",
    // --- literals ---
    "{{ 'a\\nb' }}{{ \"q\\\"q\" }}{{ 'uni\\u00e9\\x41\\101' }}{{ 'no\\escape' }}{{ 'tab\\tend' }}",
    "{{ 1 }} {{ 1.0 }} {{ 1.5e3 }} {{ 1e-7 }} {{ 0.1 + 0.2 }} {{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }}",
    "{{ [1, 'a', none, true, 1.5, [2], {'k': 'v'}] }}",
    "{{ (1,) }}{{ (1, 2) }}{{ () }}",
    "{{ {'a': 1, 'b': {'c': [1, 2]}} }}",
    "{{ none }}{{ None }}{{ True }}{{ false }}",
    "{{ 'it' 's' }}{{ \"a\" 'b' }}",
    "{{ -0.0 }} {{ 1e16 }} {{ 1e15 }} {{ 123456789.123456789 }} {{ 1/3 }} {{ 2**-1 }} {{ 2**62 }}",
    "{{ 5e-324 }} {{ tiny }} {{ huge }} {{ 1e22 }} {{ 1.5e-5 }} {{ 0.0001 }} {{ 100.0 }} {{ big }}",
    "{{ ['\u00e9', '\\x01', 'a\"b', \"a'b\", '\\u200b', '\\t', 'a\\'\"b', '\\\\'] }}",
    "{{ {'k': \"it's\"} }}{{ ['\\u2028', '\\x7f', '\\xa0', '\\U0001F600'] }}",
    "{{ 'multi\nline string' }}",
    // --- operators ---
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** 10 }} "
    "{{ 2 ** 0.5 }} {{ 7 / 2 }} {{ 6 / 2 }} {{ -7.5 // 2 }}",
    "{{ 'a' + 'b' }}{{ 'a' ~ 1 ~ none ~ true ~ 1.0 }}{{ [1] + [2] }}{{ 'ab' * 3 }}{{ 3 * 'ab' }}{{ [0] * 3 }}"
    "{{ true + 1 }}{{ 'x' * 0 }}{{ 'x' * -1 }}",
    "{{ 1 < 2 < 3 }}{{ 1 < 3 < 2 }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}{{ 1 == 1.0 }}{{ 1 != '1' }}{{ 2 >= 2 }}"
    "{{ 'B' <= 'a' }}{{ (1, 2) == [1, 2] }}{{ {'a': 1} == {'a': 1.0} }}",
    "{{ 'b' in 'abc' }}{{ 2 in lst }}{{ 'a' in d }}{{ 'z' not in d }}{{ 5 not in lst }}{{ '' in 'x' }}",
    "{{ 0 or 'x' }}{{ 1 and 'y' }}{{ '' or none }}{{ [] and 1 }}{{ not 0 }}{{ not 'a' }}{{ none or [] }}",
    "{{ 'yes' if t else 'no' }}{{ 'yes' if nil else 'no' }}[{{ 'x' if false }}]{{ 'a' if 0 else 'b' if 0 else 'c' }}",
    "{{ -n }}{{ +f }}{{ - -3 }}{{ -(2 ** 2) }}{{ -2 ** 2 }}{{ -3|abs }}",
    "{{ 1 + 2 * 3 - 4 / 2 }} {{ (1 + 2) * 3 }} {{ 2 * 3 ~ 4 }} {{ 1 ~ 2 ~ 3 }} {{ 'a' ~ 'b' | upper }}",
    "{{ n > 40 and n < 50 }}{{ lst|length > 2 }}{{ not true == false }}{{ 1 if 1 in lst }}",
    "{{ 'abc' 'def' | upper }}{{ 10 - 2 - 3 }}{{ 2 ** 3 ** 2 }}{{ 100 / 10 / 5 }}",
    // --- runtime errors (both must raise) ---
    "{{ 'a' + 1 }}",
    "{{ 1 + 'a' }}",
    "{{ [1] + (2,) }}",
    "{{ 1 / 0 }}",
    "{{ 1 // 0 }}",
    "{{ 1 % 0 }}",
    "{{ 'a' < 1 }}",
    "{{ undefined_var.attr }}",
    "{{ undefined_var + 1 }}",
    "{{ undefined_var() }}",
    "{{ n() }}",
    "{{ nil.x.y }}",
    "{% for x in 5 %}{% endfor %}",
    "{% for x in nil %}{% endfor %}",
    "{% for a, b in [1] %}{% endfor %}",
    "{% for a, b in [[1, 2, 3]] %}{% endfor %}",
    "{{ raise_exception('boom') }}",
    "{{ [].append(1) }}",
    "{{ {}.update({}) }}",
    "{% set ns = 1 %}{% set ns.x = 2 %}",
    "{{ 1 in 5 }}",
    "{{ 1 in 'abc' }}",
    "{{ lst[1:2:0] }}",
    "{{ d.missing.deeper }}",
    "{{ undefined_var[0] }}",
    "{{ undefined_var|tojson }}",
    "{{ undefined_var|int }}",
    "{{ undefined_var < 1 }}",
    "{{ -undefined_var }}",
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__() }}",
    "{{ s|abs }}",
    "{{ lst|map('nofilter')|list }}",
    "{{ lst|select('notatest')|list }}",
    "{{ range(100001)|length }}",
    "{{ lst|tojson(indent=2.5) }}",
    "{{ 'x'|indent(first=true) ~ 5|indent }}",
    "{{ {'a': 1}|dictsort(by='nope') }}",
    "{{ lst|sort(attribute='x.y') }}",
    "{{ [1, 'a']|sort }}",
    "{{ [[1], 2]|unique|list }}",
    "{{ 'a'.split('') }}",
    "{{ lst.index(9) }}",
    "{{ 'abc'.index('z') }}",
    "{{ {'a': 1}|items|length }}",
    "{{ lst|select('odd')|last }}",
    "{{ '%d' % 'x' }}",
    "{{ '%s %s' % ('a',) }}",
    "{{ '%s' % ('a', 'b') }}",
    "{{ '{0}'.format() }}",
    // --- syntax errors (both must raise) ---
    "{% if %}{% endif %}",
    "{% if true %}",
    "{{ 1 + }}",
    "{% endfor %}",
    "{{ (1 }}",
    "{{ ] }}",
    "{% foo %}",
    "{{ x|nofilter }}",
    "{{ x is notatest }}",
    "{# unterminated",
    "{% raw %}unterminated",
    "{{ 'unterminated }}",
    "{% for %}{% endfor %}",
    "{% macro m(a=1, b) %}{% endmacro %}",
    "{% break %}",
    "{% set 1 = 2 %}",
    "{{ a.b. }}",
    "{% include 'x' %}",
    "{% extends 'x' %}",
    "{% import 'x' as y %}",
    "{{ x }",
    "{{ 1 2 }}",
    "{% for x in y %}{% else %}{% else %}{% endfor %}",
    "{% if a %}{% elif %}{% endif %}",
    "{{ '\\xZZ' }}",
    "{{ x is is y }}",
    "{% call m %}{% endcall %}",
    "{% set x %}unterminated set",
    // --- filters ---
    "{{ s|upper }}{{ s|lower }}{{ s|title }}{{ 'hELLO wORLD-foo(bar [baz <qux'|title }}{{ s|capitalize }}",
    "{{ u|upper }}|{{ u|lower }}|{{ u|title }}|{{ u|capitalize }}",
    "[{{ ws|trim }}][{{ 'xxhixx'|trim('x') }}][{{ '\u3000 wide \u3000'|trim }}][{{ '\\x1c a \\x85'|trim }}]",
    "{{ s|length }}{{ u|length }}{{ lst|count }}{{ d|length }}{{ undefined_var|length }}{{ ''|length }}",
    "{{ s|replace('o', '0') }}{{ s|replace('o', '0', 1) }}{{ 'aaa'|replace('', '-') }}{{ 5|replace('5', 'five') }}",
    "{{ lst|join(', ') }}{{ lst|join }}{{ users|join('|', attribute='name') }}{{ 'abc'|join('-') }}{{ d|join(',') }}",
    "{{ lst|first }}{{ lst|last }}{{ 'xyz'|first }}{{ 'xyz'|last }}{{ d|first }}[{{ []|first }}]{{ d|last }}",
    "{{ x|default('dflt') }}{{ nil|default('dflt') }}{{ ''|default('dflt', true) }}{{ 0|d('zero', boolean=true) }}"
    "{{ s|d }}[{{ x|default }}]",
    "{{ d|tojson }}{{ users|tojson }}{{ u|tojson }}{{ 'q\"\\\\\\n\\t\\x01\\x7f\\r\\b\\f'|tojson }}{{ f|tojson }}"
    "{{ 1e20|tojson }}{{ nil|tojson }}{{ (1,2)|tojson }}{{ t|tojson }}{{ big|tojson }}",
    "{{ users|tojson(indent=2) }}{{ d|tojson(indent=0) }}{{ []|tojson(indent=2) }}{{ {}|tojson(indent=2) }}"
    "{{ {'a': [], 'b': {}}|tojson(indent='\\t') }}{{ nested|tojson(indent=4) }}",
    "{{ d|tojson(sort_keys=true) }}{{ u|tojson(ensure_ascii=true) }}{{ '\\U0001F600'|tojson(ensure_ascii=true) }}"
    "{{ d|tojson(separators=(',', ':')) }}{{ users|tojson(indent=1, separators=[';', '=']) }}",
    "{{ {1: 'a', true: 'b', none: 'c', 1.5: 'd', false: 'e'}|tojson }}",
    "{{ ('x'|safe)|tojson }}{{ {'k': 'x'|safe}|tojson }}{{ 'x'|tojson|length }}",
    "{{ f|string }}{{ lst|string }}{{ nil|string }}{{ t|string }}{{ d|string }}{{ x|string }}[{{ ''|string }}]",
    "{{ '42'|int + 1 }} {{ '3.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.99|int }} {{ -3.99|int }} {{ '0x1A'|int(0, 16) }}"
    " {{ '  12  '|int }} {{ '1_000'|int }} {{ true|int }} {{ '-5'|int }} {{ '0b11'|int(base=0) }} {{ nil|int }} "
    "{{ '1e3'|int }} {{ 'nan'|int(-1) }} {{ '12abc'|int }}",
    "{{ '3.25'|float }} {{ 'abc'|float }} {{ 2|float }} {{ ' 1e3 '|float }} {{ 'inf'|float }} {{ '-Infinity'|float }} "
    "{{ 'nan'|float }} {{ '1_0.5'|float }} {{ nil|float(1) }} {{ '.5'|float }} {{ '5.'|float }} {{ '1__0'|float }}",
    "{{ lst|list }}{{ 'ab'|list }}{{ d|list }}{{ undefined_var|list }}{{ (1, 2)|list }}",
    "{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}{{ d|items|list }}{{ undefined_var|items|list }}",
    "{{ d|dictsort }}{{ d|dictsort(reverse=true) }}{{ {'b': 1, 'A': 2, 'a': 3}|dictsort }}"
    "{{ {'b': 1, 'A': 2, 'a': 3}|dictsort(true) }}{{ {'x': 2, 'y': 1}|dictsort(by='value') }}",
    "{{ users|selectattr('age', 'equalto', 30)|map(attribute='name')|list }}"
    "{{ users|rejectattr('active')|map(attribute='name')|join(',') }}{{ users|selectattr('active', 'defined')|list|length }}",
    "{{ lst|select('odd')|list }}{{ lst|reject('odd')|list }}{{ [0, 1, '', 'a', none]|select|list }}"
    "{{ lst|select('gt', 1)|list }}{{ lst|select('in', [1, 3])|list }}{{ []|select('nosuchtest')|list }}",
    "{{ users|map(attribute='tags.0', default='none')|list }}{{ words|map('upper')|list }}"
    "{{ lst|map('string')|join('+') }}{{ users|map(attribute='missing')|list }}{{ users|map(attribute='name')|map('lower')|list }}",
    "{{ words|unique|list }}{{ words|unique(case_sensitive=true)|list }}{{ [1, 1.0, true, 2]|unique|list }}"
    "{{ users|unique(attribute='age')|map(attribute='name')|list }}",
    "{{ words|sort }}{{ words|sort(case_sensitive=true) }}{{ words|sort(reverse=true) }}"
    "{{ users|sort(attribute='age')|map(attribute='name')|list }}{{ users|sort(attribute='age,name')|map(attribute='name')|list }}"
    "{{ users|sort(attribute='age', reverse=true)|map(attribute='name')|list }}",
    "{{ lst|min }}{{ lst|max }}{{ words|min }}{{ words|max }}{{ words|max(case_sensitive=true) }}"
    "{{ users|max(attribute='age')|tojson }}[{{ []|min }}]{{ (users|min(attribute='age'))['name'] }}",
    "{{ lst|sum }}{{ users|sum(attribute='age') }}{{ [0.5, 1]|sum }}{{ lst|sum(start=10) }}{{ [[1], [2]]|sum(start=[]) }}",
    "{{ lst|reverse|list }}{{ 'abc'|reverse }}{{ d|reverse|list }}{{ u|reverse }}",
    "{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 42.55|round(1, 'floor') }} {{ 42.51|round(1, 'ceil') }} "
    "{{ 7|round }} {{ 1234|round(-2) }} {{ -2.5|round }} {{ 1250|round(-2) }} {{ 0.125|round(2) }}",
    "{{ -5|abs }}{{ -2.5|abs }}{{ true|abs }}",
    "{{ multiline|indent }}|{{ multiline|indent(2, true) }}|{{ multiline|indent(2, blank=true) }}|"
    "{{ multiline|indent('>> ', first=true) }}|{{ ''|indent(first=true) }}|{{ 'a\\r\\nb\\rc\\x0bd'|indent(1) }}|"
    "{{ 'x\\n'|indent }}|{{ '\\n'|indent(first=true, blank=true) }}",
    "{{ s|wordcount }}{{ 'a-b c_d, \u00e9!'|wordcount }}{{ ''|wordcount }}",
    "{{ '<a href=\"x\">&</a>'|e }}{{ '<b>'|escape|escape }}{{ '<i>'|safe }}{{ ('<i>'|safe) + '<b>' }}"
    "{{ '<b>' + ('<i>'|safe) }}{{ ('x'|safe) ~ '<b>' }}{{ '<x>'|forceescape }}{{ 5|e }}{{ nil|e }}",
    "{{ \"'\"|safe + \"'\" }}{{ ('a'|safe).upper() + '<' }}{{ ('a'|safe)|replace('a', 'b') + '<' }}"
    "{{ ('a'|safe)|trim + '<' }}{{ ('a'|safe)|lower + '<' }}{{ ('a'|safe)|string + '<' }}{{ (('a'|safe) ~ 'b') + '<' }}",
    "{{ ('a'|safe)|indent + '<' }}{{ ('a'|safe)[0] + '<' }}{{ ('ab'|safe)[0:1] + '<' }}{{ ('a'|safe)|title + '<' }}"
    "{{ ('a'|safe)|capitalize + '<' }}{{ ('a'|safe)|center(3) + '<' }}{{ ('%s'|safe) % '<' }}{{ ('a'|safe) * 2 + '<' }}",
    "{{ ['<', '>'|safe]|join }}{{ ('%s'|safe)|format('<') }}{{ ('a b'|safe).split() }}{{ ['a'|safe] }}"
    "{{ ('<a>'|safe) is escaped }}{{ 'x' is escaped }}{{ (','|safe).join(['<', 'b']) }}",
    "{{ lst|batch(2)|list }}{{ lst|batch(2, 'x')|list }}{{ lst|slice(2)|list }}{{ range(7)|slice(3, 0)|list }}",
    "{{ 'x'|center(9) }}|{{ 'ab'|center(5) }}|{{ 'abc'|center(6) }}|{{ s|truncate(8) }}|{{ s|truncate(8, true) }}|"
    "{{ 'foo bar baz qux'|truncate(11, false, '...', 0) }}|{{ 'short'|truncate(3, leeway=5) }}",
    "{{ '%s-%05.1f|%d|%x|%r|%%|%5s|%-5s|' % ('a', 3.14159, 42.9, 255, 'q', 'r', 'l') }}"
    "{{ '%(a)s+%(b)d'|format(a='x', b=2) }}{{ '%s'|format([1]) }}{{ '%.3e' % 12345.678 }}{{ '%g' % 0.00001 }}"
    "{{ '%s' % none }}{{ '%s' % {'k': 1} }}{{ '%+d|% d|%#x|%o|%c' % (5, 5, 255, 8, 65) }}",
    "{{ users|groupby('age')|list }}",
    "{% for age, group in users|groupby('age') %}{{ age }}:{{ group|map(attribute='name')|join(',') }};{% endfor %}"
    "{% for g in words|groupby('0') %}{{ g.grouper }}{{ g.list }}{% endfor %}",
    "{{ users[0]|attr('name') }}[{{ d|attr('a') }}]{{ d|attr('items') is callable }}",
    "{{ lst|map('int')|sum }}{{ s|e|length }}{{ n|string|length }}{{ [1,2,3]|map('string')|join }}",
    "{{ nested.x.y|selectattr('z', 'defined')|list }}{{ nested.x.y|select('number')|list }}",
    "{{ lst|map('string')|list|tojson }}{{ lst|select|list|tojson }}",
    // --- tests ---
    "{{ n is number }}{{ t is number }}{{ f is float }}{{ n is integer }}{{ t is integer }}{{ t is boolean }}"
    "{{ n is odd }}{{ n is even }}{{ n is divisibleby 7 }}{{ n is divisibleby(5) }}{{ f is odd }}",
    "{{ s is string }}{{ lst is sequence }}{{ d is mapping }}{{ lst is iterable }}{{ n is iterable }}{{ s is lower }}"
    "{{ 'ABC' is upper }}{{ nil is none }}{{ t is true }}{{ 1 is true }}{{ false is false }}{{ 0 is false }}",
    "{{ x is defined }}{{ x is undefined }}{{ s is defined }}{{ d.zz is defined }}{{ x is sequence }}"
    "{{ x is iterable }}{{ x is callable }}{{ range is callable }}{{ s.upper is callable }}{{ x is mapping }}",
    "{{ 1 is eq 1 }}{{ 1 is equalto(2) }}{{ 2 is gt 1 }}{{ 2 is ge 2 }}{{ 1 is lt 2 }}{{ 1 is le 0 }}{{ 1 is ne 2 }}"
    "{{ 1 is in [1] }}{{ 'upper' is filter }}{{ 'odd' is test }}{{ none is sameas none }}{{ 1 is sameas 1 }}"
    "{{ lst|select('==', 1)|list }}{{ lst|select('>', 1)|list }}{{ lst|select('!=', 1)|list }}{{ lst|select('le', 2)|list }}",
    "{{ users|selectattr('age', '>', 26)|list|length }}{{ lst is not string }}{{ not lst is string }}",
    "{{ d.items is callable }}{{ nested is mapping }}{{ (1, 2) is sequence }}{{ lst|select('odd') is iterable }}"
    "{{ lst|select('odd') is sequence }}{{ 'a'|safe is string }}",
    // --- loops ---
    "{% for i in lst %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/"
    "{{ loop.last }}/{{ loop.length }}/{{ loop.previtem }}/{{ loop.nextitem }};{% endfor %}",
    "{% for i in [] %}x{% else %}empty{% endfor %}{% for i in lst if i > 5 %}x{% else %}none{% endfor %}",
    "{% for i in lst if i != 1 %}{{ loop.index }}:{{ i }}:{{ loop.length }}:{{ loop.last }} {% endfor %}",
    "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}"
    "{% endfor %}",
    "{% for a in [1,2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}{{ loop.index }}|{% endfor %}",
    "{% for k in d %}{{ k }}{% endfor %}{% for c in u %}{{ c }}.{% endfor %}",
    "{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %}{% for (a, b), c in [((1, 2), 3)] %}{{ a }}{{ b }}{{ c }}"
    "{% endfor %}{% for a, b in ['xy'] %}{{ b }}{{ a }}{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}:{{ v }} {% endfor %}{% for k, v in d|dictsort %}{{ k }}{% endfor %}",
    "{% for i in lst %}{{ loop.cycle('odd', 'even') }}{% endfor %}",
    "{% for i in [1, 1, 2, 3, 3] %}{% if loop.changed(i) %}{{ i }}{% endif %}{% endfor %}",
    "{% for item in [{'n': 'a', 'c': [{'n': 'b', 'c': []}, {'n': 'c', 'c': [{'n': 'd', 'c': []}]}]}] recursive %}"
    "{{ item.n }}({{ loop.depth }}{{ loop.depth0 }}){% if item.c %}[{{ loop(item.c) }}]{% endif %}{% endfor %}",
    "{% for x in undefined_var %}x{% else %}no{% endfor %}",
    "{% set x = 0 %}{% for i in [1,2] %}{{ x }}{% set x = x + i %}{{ x }};{% endfor %}{{ x }}",
    "{% for i in [1] %}{{ loop.index }}{% endfor %}[{{ loop }}]",
    "{% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(1, 10, 4) %}{{ i }}{% endfor %}"
    "{% for i in range(5, 0, -2) %}{{ i }}{% endfor %}{% for i in range(0) %}x{% endfor %}",
    "{% for i in lst %}{% set y = i %}{% endfor %}[{{ y }}]",
    "{% for i in lst %}{% if loop.first %}[{% endif %}{{ i }}{% if not loop.last %}, {% else %}]{% endif %}{% endfor %}",
    "{% for m in users %}{% if loop.previtem is defined %}{{ loop.previtem.name }}>{% endif %}{{ m.name }} {% endfor %}",
    "{% for i in lst %}{% for j in lst %}{% if j == 1 %}{% break %}{% endif %}{{ i }}{{ j }} {% endfor %}{% endfor %}",
    "{% for i in lst %}{% set outer = loop %}{% for j in [1] %}{{ outer.index }}{{ loop.index }}{% endfor %}{% endfor %}",
    // --- scoping, set, namespace, blocks ---
    "{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}",
    "{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}",
    "{% set ns = namespace(x=1, y='a') %}{% for i in [1,2,3] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}{{ ns.y }}"
    "[{{ ns.z }}]",
    "{% set ns = namespace() %}{% set ns.items = [] %}{% for i in lst %}{% set ns.items = ns.items + [i * 2] %}"
    "{% endfor %}{{ ns.items }}",
    "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns }}{{ ns['a'] }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = 1, 2 %}{{ c }}{% set (p, q) = 'xy' %}{{ q }}{{ p }}",
    "{% set block %}  content {{ n }} {% endset %}[{{ block }}]{% set b2 | trim | upper %}  hi  {% endset %}[{{ b2 }}]",
    "{% filter upper %}hello {{ s }}{% endfilter %}{% filter trim|replace('a', 'b') %}  banana  {% endfilter %}",
    "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]{% with %}{% set q = 1 %}{% endwith %}[{{ q }}]",
    "{% set x = 5 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 6 %}{{ m() }}",
    "{% macro outer() %}{% set y = 1 %}{% macro inner() %}{{ y }}{% endmacro %}{{ inner() }}{% endmacro %}{{ outer() }}",
    "{% set x = 1 %}{% macro m() %}{{ x }}{% set x = 2 %}{{ x }}{% endmacro %}{{ m() }}{{ x }}",
    "{% set x = 1 %}{% set y %}{% set x = 2 %}{{ x }}{% endset %}{{ y }}{{ x }}",
    "{% set s = s ~ '!' %}{{ s }}{% set lst = lst + [4] %}{{ lst }}",
    "{% set messages = [1, 2, 3] %}{% set messages = messages[1:] %}{{ messages }}",
    "{% if true %}{% set z = 'in-if' %}{% endif %}{{ z }}",
    // --- macros and call blocks ---
    "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Ann') }} "
    "{{ greet('Bob', 'Hi') }} {{ greet(greeting='Yo', name='Cid') }} {{ greet() }}",
    "{% macro m(a) %}{{ a }}|{{ varargs }}|{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}{{ m() }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(b=1) }}",
    "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ n }}{% endcall %}",
    "{% macro each(items) %}{% for i in items %}{{ caller(i, loop.index) }}{% endfor %}{% endmacro %}"
    "{% call(x, i) each(lst) %}[{{ i }}:{{ x }}]{% endcall %}",
    "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(10) }}",
    "{% macro m() %}x{% endmacro %}{{ m }}",
    "{% macro m(a, b=a * 2) %}{{ a }}{{ b }}{% endmacro %}{{ m(3) }}{{ m(3, 1) }}",
    "{{ m is defined }}{% macro m() %}{% endmacro %}{{ m is defined }}",
    "{% macro m() %}{{ caller is defined }}{% endmacro %}{{ m() }}",
    "{% macro m(x) %}  {{ x }}  {% endmacro %}[{{ m(1) }}][{{ m(1)|trim }}][{{ m(1) ~ m(2) }}]",
    "{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(5) }}",
    "{% macro m(a, b) %}{{ a }}-{{ b }}{% endmacro %}{{ m(*[1, 2]) }}{{ m(**{'a': 3, 'b': 4}) }}{{ m(5, **{'b': 6}) }}",
    // --- methods ---
    "{{ s.upper() }}{{ s.lower() }}{{ s.split() }}{{ s.split('o') }}{{ s.split('o', 1) }}{{ s.rsplit('o', 1) }}"
    "{{ ' a  b '.split(' ') }}{{ s.startswith('He') }}{{ s.endswith(('x', 'ld')) }}{{ s.replace('l', 'L', 2) }}"
    "{{ s.find('o') }}{{ s.rfind('o') }}{{ s.count('l') }}{{ u.find('w') }}",
    "{{ ws.strip() }}|{{ ws.lstrip() }}|{{ ws.rstrip() }}|{{ 'xxaxx'.strip('x') }}|{{ s.title() }}|"
    "{{ 'hello world'.capitalize() }}|{{ '-'.join(['a', 'b']) }}|{{ 'a\\nb\\r\\nc'.splitlines() }}|{{ \"they're\".title() }}",
    "{{ '{} and {}'.format('x', 1) }}{{ '{0}{1}{0}'.format('a', 'b') }}{{ '{name}!'.format(name='N') }}"
    "{{ '{:>5}|{:<4}|{:^6}|{:.2f}|{:05d}|{!r}|{:x}|{:+d}|{:e}|{}'.format('r', 'l', 'c', 3.14159, 42, 'q', 255, 3, 1.5, 2.5) }}",
    "{{ d.get('a') }}{{ d.get('zz') }}{{ d.get('zz', 'dflt') }}{{ d.keys()|list }}{{ d.values()|list }}"
    "{{ d.items()|list }}{{ d['items'] }}{{ d.items is defined }}{{ d.get('items') }}",
    "{{ lst.index(2) }}{{ lst.count(1) }}{{ (1, 2, 1).count(1) }}[{{ [].append }}]",
    "{{ 'ab'.partition('b') }}{{ 'abc'.isalpha() }}{{ '123'.isdigit() }}{{ ' '.isspace() }}{{ 'x'.zfill(3) }}"
    "{{ 'ab'.ljust(4, '*') }}|{{ 'ab'.rjust(4) }}|{{ 'abc'.removeprefix('a') }}{{ 'abc'.removesuffix('c') }}"
    "{{ 'Ab'.swapcase() }}{{ ''.isalpha() }}{{ 'aB'.islower() }}",
    "{{ s.split(none, 1) }}{{ '  a b  c '.rsplit(none, 1) }}{{ 'a,b,,c'.split(',') }}{{ ''.split() }}{{ ''.split(',') }}",
    "{{ 'x'.startswith('') }}{{ 'abc'.startswith('b', 1) }}{{ 'abc'.endswith('b', 0, 2) }}",
    // --- subscripts and slicing ---
    "{{ lst[0] }}{{ lst[-1] }}{{ lst[1:] }}{{ lst[:-1] }}{{ lst[::-1] }}{{ lst[::2] }}{{ s[1:4] }}{{ s[-3:] }}"
    "{{ u[1:3] }}{{ u[::-1] }}{{ nested.x.y[2].z }}{{ nested['x']['y'][0] }}{{ lst.0 }}{{ users.1.name }}",
    "[{{ lst[10] }}][{{ d.missing }}][{{ d['missing'] }}][{{ s[100] }}][{{ lst[-10:10] }}][{{ lst[1.5] }}]",
    "{{ lst[1.5:] }}",
    "{{ d[1:] }}",
    "{{ n[1:] }}",
    "{{ (1, 2, 3)[1:] }}[{{ 'abc'[5:] }}][{{ lst['x'] }}]{{ lst[true] }}{{ s[-1] }}{{ lst[5:1:-1] }}{{ s[::-2] }}",
    "{{ d['b'] }}{{ d.b }}{{ users[0]['tags'][0] }}{{ lst[1:][0] }}{{ lst[:2]|sum }}",
    // --- undefined ---
    "[{{ x }}][{{ x|upper }}][{{ x ~ 'a' }}][{{ x|default('d') }}][{{ x|string }}][{{ x|join }}][{{ x|list }}]"
    "[{{ x|trim }}][{{ x|length }}][{{ x|first }}][{{ x|last }}][{{ x|sum }}][{{ x|sort }}][{{ x|select|list }}]",
    "{% if x %}t{% else %}f{% endif %}{% if not x %}nt{% endif %}{{ x == x }}{{ x == none }}{{ x is none }}"
    "{{ x != 1 }}{{ 1 in x }}{{ x in [1] }}",
    "{{ ''.__class__ }}{{ d.__class__ }}{{ s.__len__ }}{{ lst.__getitem__ }}{{ d['__class__'] }}{{ d.__dict__ }}",
    "{{ x|lower }}{{ x|capitalize }}{{ x|title }}{{ x|wordcount }}{{ x|center(3) }}|{{ x|safe }}|{{ x|e }}|",
    // --- misc globals ---
    "{% set j = joiner(', ') %}{% for i in lst %}{{ j() }}{{ i }}{% endfor %}",
    "{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}{{ c.current }}",
    "{{ strftime_now('%Y-%m-%d %H:%M:%S %a %b %d %j %p %I %y %%') }}{{ strftime_now('%d %b %Y') }}",
    "{% generation %}gen {{ n }}{% endgeneration %}",
    "{{ {'a': 1, 'a': 2} }}{{ {1: 'x', 1.0: 'y'} }}{{ {(1, 2): 'tuple key'} }}",
    "{{ dict(a=1, b=2) }}{{ dict([('x', 1)]) }}{{ dict({'y': 2}, z=3) }}{{ dict() }}",
    "{% if true %}yes{% elif false %}no{% else %}maybe{% endif %}{% if false %}a{% elif 1 %}b{% endif %}"
    "{% if false %}c{% elif false %}d{% endif %}",
    "{% print s %}{% print 1, 2 %}",
    "{{ 'x' }}{{ s, n }}{{ (s, n) }}",
    "{{ range(3)|list }}{{ range(1, 4)|list }}{{ range(3)|length }}{{ range(10)[2] }}{{ 2 in range(3) }}",
    "{{ namespace(a=1).a }}",
    "{{ t and 'x' or 'y' }}{{ nil and 'x' or 'y' }}",
    "{{ \"Use the function '\"|safe + s + \"' to '\"|safe + 'say \"hi\" & <bye>' + \"'\\n\"|safe + d|tojson }}",
    "{%- set x = {'role': 'user'} -%}{{ x.role|lower == 'user' }}{{ x['role'] }}{{ x.get('role') }}",
    "{{ messages }}{{ messages is defined }}{{ tools is none }}",
    // --- fragments of recent real templates ---
    // Qwen3: reverse scan with a namespace, reasoning split out of the content.
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n"
    "    {%- set index = (messages|length - 1) - loop.index0 %}\n"
    "    {%- if ns.multi_step_tool and message.role == \"user\" and message.content is string and "
    "not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}\n"
    "        {%- set ns.multi_step_tool = false %}\n"
    "        {%- set ns.last_query_index = index %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{{- ns.last_query_index }}\n"
    "{%- for message in messages %}\n"
    "    {%- if message.content is string %}{%- set content = message.content %}{%- else %}{%- set content = '' %}"
    "{%- endif %}\n"
    "    {%- if message.role == \"assistant\" %}\n"
    "        {%- set reasoning_content = '' %}\n"
    "        {%- if message.reasoning_content is string %}\n"
    "            {%- set reasoning_content = message.reasoning_content %}\n"
    "        {%- elif '</think>' in content %}\n"
    "            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1]"
    ".lstrip('\\n') %}\n"
    "            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + "
    "'\\n</think>\\n\\n' + content.lstrip('\\n') + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n",
    // Gemma 3: content given as a string or a list of typed parts.
    "{%- for message in messages %}{%- if message['content'] is string %}{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable %}{%- for item in message['content'] %}"
    "{%- if item['type'] == 'image' %}<start_of_image>{%- elif item['type'] == 'text' %}{{ item['text'] | trim }}"
    "{%- endif %}{%- endfor %}{%- endif %}|{%- endfor %}",
    "{{ (messages|selectattr('role', 'equalto', 'user')|list|last).content|map(attribute='type')|join(',') }}"
    "{{ messages|map(attribute='role')|unique|list }}{{ messages|rejectattr('content', 'string')|list|length }}",
};

TEST(ChatTemplateSemantics, SnippetsMatchJinja2) {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(kContext);
  nlohmann::ordered_json cases = nlohmann::ordered_json::array();
  for (const auto& src : kCases) cases.push_back({{"template", src}, {"context", ctx}});
  auto ref = chat_template_test::run_reference_cases(cases);
  if (!ref.available) GTEST_SKIP() << "reference renderer unavailable: " << ref.why;
  ASSERT_TRUE(ref.why.empty()) << ref.why;
  const auto& results = ref.result["results"];
  ASSERT_EQ(results.size(), kCases.size());
  ChatTemplateRenderOptions opts;
  opts.now_unix_seconds = ref.result["now_unix_seconds"].get<int64_t>();
  size_t identical = 0, both_raise = 0;
  // SERVAL_CHAT_TEMPLATE_VERBOSE=1 lists the cases that fail in both, with both messages.
  const bool verbose = std::getenv("SERVAL_CHAT_TEMPLATE_VERBOSE") != nullptr;
  for (size_t i = 0; i < kCases.size(); ++i) {
    const auto& r = results[i];
    std::optional<std::string> got;
    std::string err;
    auto t = ChatTemplate::compile(kCases[i]);
    if (t.ok()) {
      auto g = t->render(ctx, opts);
      if (g.ok()) {
        got = *g;
      } else {
        err = g.status().message();
      }
    } else {
      err = t.status().message();
    }
    const std::string where = "case " + std::to_string(i) + ": " + nlohmann::json(kCases[i]).dump();
    if (r.contains("output")) {
      if (!got) {
        ADD_FAILURE() << where << "\n  jinja2 rendered " << nlohmann::json(r["output"]).dump() << "\n  we failed: " << err;
      } else if (*got != r["output"].get<std::string>()) {
        ADD_FAILURE() << where << "\n  " << chat_template_test::first_difference(r["output"].get<std::string>(), *got);
      } else {
        ++identical;
      }
    } else {
      if (got) {
        ADD_FAILURE() << where << "\n  jinja2 raised " << r["error"].get<std::string>() << "\n  we rendered "
                      << nlohmann::json(*got).dump();
      } else {
        ++both_raise;
        if (verbose) std::cout << where << "\n  jinja2: " << r["error"].get<std::string>() << "\n  ours:   " << err << "\n";
      }
    }
  }
  std::cout << "[ chat templates ] " << kCases.size() << " snippets: " << identical << " byte-identical, "
            << both_raise << " raise in both\n";
}

}  // namespace
}  // namespace serval
