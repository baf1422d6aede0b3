"""The YAML reader of recipes and ``--set`` values: yaml.safe_load's rules, stricter.

A recipe is a small tree of named settings, so whatever YAML allows beyond that is a mistake
or an attack, refused where it is written instead of surfacing later as a wrong run:

- a key written twice in one mapping (plain YAML keeps the last one silently);
- aliases (``*name``) and merge keys (``<<``): a few hundred bytes of nested aliases expand
  to billions of nodes once the tree is walked ("billion laughs");
- nesting deeper than MAX_DEPTH (the composer recurses per level: a deep enough file would
  end in a RecursionError);
- a key that is not a name (``1:``, ``on:``, ``? [a]``): sections and settings are strings,
  and so are the keys of a DeepSpeed (JSON) config.

Like SafeLoader, no tag constructs a Python object: only SafeLoader's constructors exist here.
"""
import yaml
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from ..shown import shown

# A recipe is 2 levels deep, DeepSpeed overrides under zero.overrides a few more; the composer
# takes a few Python frames per level, so this stays far below the interpreter's limit.
MAX_DEPTH = 32
_MERGE_TAG = "tag:yaml.org,2002:merge"


class RecipeYAMLError(yaml.MarkedYAMLError):
    """YAML that is well formed but not allowed in a recipe; ``problem`` says why and
    ``problem_mark`` where."""

    def __init__(self, problem: str, mark):
        super().__init__(problem=problem, problem_mark=mark)


class RecipeLoader(yaml.SafeLoader):
    """SafeLoader refusing duplicate keys, aliases, merge keys, deep nesting and keys that
    are not strings (see the module's docstring)."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        # Aliases are refused before they are resolved: no shared subtree ever exists.
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise RecipeYAMLError(f"YAML alias *{event.anchor} is not allowed in a recipe; write the value out",
                                  event.start_mark)
        if self._depth >= MAX_DEPTH:
            raise RecipeYAMLError(f"nested more than {MAX_DEPTH} levels deep", self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, MappingNode):
            first_line = {}
            for key_node, _ in node.value:
                key = self._name(key_node)
                line = key_node.start_mark.line + 1
                if key in first_line:
                    first = "" if first_line[key] == line else f"first on line {first_line[key]}; "
                    raise RecipeYAMLError(f"duplicate key {shown(key)} ({first}YAML would keep only the last)",
                                          key_node.start_mark)
                first_line[key] = line
        return super().construct_mapping(node, deep=deep)

    def _name(self, key_node) -> str:
        if key_node.tag == _MERGE_TAG:
            raise RecipeYAMLError("YAML merge key << is not allowed in a recipe; write the keys out",
                                  key_node.start_mark)
        if not isinstance(key_node, ScalarNode):
            kind = "sequence" if isinstance(key_node, SequenceNode) else "mapping"
            raise RecipeYAMLError(f"a key must be a name, got a {kind}", key_node.start_mark)
        key = self.construct_object(key_node)
        if not isinstance(key, str):
            # YAML 1.1 reads 1, on, no, null, 2024-01-01 as numbers, booleans, null, dates.
            read = "null" if key is None else f"{type(key).__name__} {shown(key)}"
            raise RecipeYAMLError(f"key {shown(key_node.value)} is not a name (YAML reads it as {read}); "
                                  "quote it if it is one", key_node.start_mark)
        return key


def load(text: str):
    """The tree of one YAML document under RecipeLoader's rules; yaml.YAMLError otherwise
    (RecipeYAMLError for what is refused here)."""
    loader = RecipeLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
