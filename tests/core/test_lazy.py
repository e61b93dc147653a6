"""finnlite.core.lazy: sympy (imported by onnx_ir) loads only when something uses it."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_streamline_command_imports_do_not_run_sympy():
    out = _run("""
        import sys
        import finnlite.cli, finnlite.build
        print('sympy.core' in sys.modules)
    """)
    assert out == "False"


def test_symbolic_dimensions_compute_as_without_finnlite():
    code = """
        import sys
        {first}
        import onnx_ir as ir
        n = ir.SymbolicDim('N')
        try:
            print(n + 1, n * 2, n // 2)
        except TypeError:  # an onnx_ir without symbolic arithmetic (and without sympy)
            print('no arithmetic')
    """
    alone = _run(code.format(first="pass"))
    assert _run(code.format(first="import finnlite.build")) == alone
    assert alone in ("N + 1 2*N floor(N/2)", "no arithmetic")


def test_a_model_with_a_symbolic_batch_loads_and_runs():
    out = _run("""
        import numpy as np
        import onnx
        from onnx import TensorProto, helper
        from finnlite import Model
        from finnlite.core.compat import make_model
        x = helper.make_tensor_value_info('x', TensorProto.FLOAT, ['N', 3])
        y = helper.make_tensor_value_info('y', TensorProto.FLOAT, ['N', 3])
        graph = helper.make_graph([helper.make_node('Relu', ['x'], ['y'])], 'g', [x], [y])
        model = Model(make_model(graph))
        out = model.execute({'x': np.array([[-1, 0, 2]], dtype=np.float32)})
        print(out['y'].tolist())
    """)
    assert out == "[[0.0, 0.0, 2.0]]"
