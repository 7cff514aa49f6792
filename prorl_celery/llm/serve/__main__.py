"""``python -m prorl_celery.llm.serve --scripted rules.json --port 8000``"""
from .cli import llm_serve

if __name__ == "__main__":
    llm_serve()
