from django.apps import AppConfig


class FlowBenchAppConfig(AppConfig):
    name = "benchmarks.flowapp"
    label = "flowbenchapp"
