"""The suite's rule for deprecations: one that megatron-core, DeepSpeed, lm-eval or datatrove raises, or one raised at
a line of mtnlg, is an error, in the pytest process (tests/conftest.py) and in every Python process the tests start
(this folder is on their PYTHONPATH: sitecustomize.py here calls `install`). A library's deprecation names the module
that called the deprecated function (its stacklevel), so a call of ours into megatron-core's layers surfaces as
megatron-core's own module calling its deprecated helper: the rule covers the libraries' modules, and `NOT_OURS`
lists the few deprecations a library raises on its own, whatever we call."""
import warnings

LIBRARIES = ["megatron", "deepspeed", "lm_eval", "datatrove", "mtnlg"]        # module name prefixes
CATEGORIES = [DeprecationWarning, PendingDeprecationWarning, FutureWarning]
# (module the warning names, or a prefix of it; message start; why it is not from a call of ours)
NOT_OURS = [("megatron.core.inference.contexts", "The following imports from `dynamic_context.py` will be removed",
             "megatron-core 0.19.2 imports its inference package from `import megatron.core` itself"),
            ("megatron.core.transformer", "The 'megatron.core.transformer.custom_layers.transformer_engine'",
             "megatron-core 0.16.1's own gpt_layer_specs imports this deprecated module of its own"),
            ("megatron.core.transformer", "MLP requires ffn_hidden_size, but it was not provided",
             "megatron-core's own GPT layer specs build their MLP so (tests/test_plan.py counts its GPTModel)")]

def rules() -> list[tuple[str, str, type, str]]:
    "(action, message regex, category, module regex), lowest precedence first (as pytest's filterwarnings lines)."
    out = [("error", "", c, lib) for lib in LIBRARIES for c in CATEGORIES]
    return out + [("ignore", msg, c, mod) for mod, msg, _ in NOT_OURS for c in CATEGORIES]

def install():
    "Put the rules in front of this process's warning filters (after a blanket `ignore` too)."
    for action, message, category, module in rules():
        warnings.filterwarnings(action, message=message, category=category, module=module)
